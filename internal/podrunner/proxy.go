package podrunner

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// dialTimeout bounds connecting to one replica; a refused or slow replica
// passes the connection on to the next one.
const dialTimeout = 2 * time.Second

// service is a Service exposed on local ports, one TCP proxy per service port.
type service struct {
	namespace, name string
	uid             types.UID
	selector        labels.Selector // nil: no endpoints (a Service without selector)
	proxies         map[int32]*proxy
}

func (s *service) close() {
	for _, p := range s.proxies {
		p.close()
	}
}

// proxy balances the connections to one service port round-robin over the
// ready replicas the Service selects, as kube-proxy does per connection.
type proxy struct {
	r    *Runner
	svc  *service
	port corev1.ServicePort // guarded by Runner.mu
	ln   net.Listener
	next atomic.Uint64

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func (r *Runner) listServices() []*corev1.Service {
	var out []*corev1.Service
	for _, l := range r.svcList {
		ss, err := l.List(labels.Everything())
		if err != nil {
			continue
		}
		out = append(out, ss...)
	}
	return out
}

// syncServices opens and closes the proxies to match the Services; r.mu is held.
func (r *Runner) syncServices() {
	seen := map[string]bool{}
	for _, svc := range r.listServices() {
		if svc.DeletionTimestamp != nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		k := svc.Namespace + "/" + svc.Name
		seen[k] = true
		s := r.svcs[k]
		if s != nil && s.uid != svc.UID {
			s.close()
			s = nil
		}
		if s == nil {
			s = &service{namespace: svc.Namespace, name: svc.Name, uid: svc.UID, proxies: map[int32]*proxy{}}
			r.svcs[k] = s
		}
		s.selector = nil
		if len(svc.Spec.Selector) > 0 {
			s.selector = labels.SelectorFromSet(svc.Spec.Selector)
		}
		ports := map[int32]bool{}
		for _, sp := range svc.Spec.Ports {
			if sp.Protocol != "" && sp.Protocol != corev1.ProtocolTCP {
				continue
			}
			ports[sp.Port] = true
			if p := s.proxies[sp.Port]; p != nil {
				p.port = sp
				continue
			}
			p, err := r.newProxy(s, sp)
			if err != nil {
				r.log.Warn("cannot expose service port", "service", k, "port", sp.Port, "err", err)
				continue
			}
			s.proxies[sp.Port] = p
			r.log.Info("service exposed", "service", k, "port", sp.Port, "address", p.ln.Addr().String())
		}
		for port, p := range s.proxies {
			if !ports[port] {
				p.close()
				delete(s.proxies, port)
			}
		}
	}
	for k, s := range r.svcs {
		if !seen[k] {
			s.close()
			delete(r.svcs, k)
			r.log.Info("service gone", "service", k)
		}
	}
}

func (r *Runner) newProxy(s *service, sp corev1.ServicePort) (*proxy, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(podIP, "0"))
	if err != nil {
		return nil, err
	}
	p := &proxy{r: r, svc: s, port: sp, ln: ln, conns: map[net.Conn]struct{}{}}
	go p.serve()
	return p, nil
}

// endpoints are the addresses of the ready replicas behind a service port.
func (r *Runner) endpoints(p *proxy) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.endpointsLocked(p)
}

func (r *Runner) endpointsLocked(p *proxy) []string {
	sel := p.svc.selector
	if sel == nil {
		return nil
	}
	target := p.port.TargetPort
	if target.Type == intstr.Int && target.IntVal == 0 {
		target = intstr.FromInt32(p.port.Port)
	}
	var eps []string
	for _, st := range r.deps {
		if st.namespace != p.svc.namespace {
			continue
		}
		for _, rp := range st.replicas {
			if !sel.Matches(labels.Set(rp.template.Labels)) {
				continue
			}
			if ep, ok := rp.endpoint(target); ok {
				eps = append(eps, ep)
			}
		}
	}
	sort.Strings(eps)
	return eps
}

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // e.g. out of file descriptors
			continue
		}
		go p.handle(c)
	}
}

// track registers a connection so that close can end it; false once closed.
func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *proxy) handle(client net.Conn) {
	if !p.track(client) {
		client.Close()
		return
	}
	defer p.untrack(client)
	eps := p.r.endpoints(p)
	if len(eps) == 0 {
		return // no ready replica: the connection is refused, as by kube-proxy
	}
	first := int(p.next.Add(1) % uint64(len(eps)))
	var backend net.Conn
	for i := range eps {
		c, err := net.DialTimeout("tcp", eps[(first+i)%len(eps)], dialTimeout)
		if err == nil {
			backend = c
			break
		}
	}
	if backend == nil || !p.track(backend) {
		if backend != nil {
			backend.Close()
		}
		return
	}
	defer p.untrack(backend)
	pipe(client, backend)
}

// pipe copies both ways. A direction that ends cleanly half-closes the other
// side; an error (a replica that died) ends both.
func pipe(a, b net.Conn) {
	errc := make(chan error, 2)
	cp := func(dst, src net.Conn) {
		_, err := io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok && err == nil {
			_ = tc.CloseWrite()
		}
		errc <- err
	}
	go cp(a, b)
	go cp(b, a)
	if err := <-errc; err != nil {
		a.Close()
		b.Close()
	}
	// The other direction ends too; its error says nothing new.
	<-errc //nolint:errcheck // see above
}

// close stops accepting and ends every open connection.
func (p *proxy) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
}

// addr is the proxy's local address.
func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) String() string {
	return fmt.Sprintf("%s/%s:%d", p.svc.namespace, p.svc.name, p.port.Port)
}
