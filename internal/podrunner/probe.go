package podrunner

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// fastProbe is how often a readiness probe runs until its first success. The
// kubelet waits periodSeconds between attempts from the start; probing sooner
// only makes a fresh replica ready sooner (a one-off wait, not a semantic change).
const fastProbe = 200 * time.Millisecond

// probeClient: one request per probe, no connection reuse, like the kubelet.
var probeClient = &http.Client{
	Transport: &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the kubelet does not verify probe certificates either
	},
}

// probeTarget maps container ports onto the replica's local ports.
type probeTarget struct {
	container *corev1.Container
	ports     map[int32]int // container port -> where this replica listens
}

// port resolves a probe's port (a number or a container port name).
func (t probeTarget) port(p intstr.IntOrString) (int, error) {
	n := int32(p.IntValue())
	if p.Type == intstr.String {
		n = 0
		for _, cp := range t.container.Ports {
			if cp.Name == p.StrVal {
				n = cp.ContainerPort
			}
		}
		if n == 0 {
			return 0, fmt.Errorf("no container port named %q", p.StrVal)
		}
	}
	local, ok := t.ports[n]
	if !ok {
		return 0, fmt.Errorf("port %d: the replica listens on no address of that port (its listen variables name %v)", n, slices.Sorted(maps.Keys(t.ports)))
	}
	return local, nil
}

// check runs a probe once.
func (t probeTarget) check(ctx context.Context, p *corev1.Probe) error {
	timeout := time.Duration(max(p.TimeoutSeconds, 1)) * time.Second
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case p.HTTPGet != nil:
		g := p.HTTPGet
		port, err := t.port(g.Port)
		if err != nil {
			return err
		}
		host := g.Host
		if host == "" {
			host = podIP
		}
		scheme := "http"
		if g.Scheme == corev1.URISchemeHTTPS {
			scheme = "https"
		}
		u := url.URL{Scheme: scheme, Host: net.JoinHostPort(host, strconv.Itoa(port)), Path: g.Path}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return err
		}
		for _, h := range g.HTTPHeaders {
			req.Header.Add(h.Name, h.Value)
		}
		resp, err := probeClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("HTTP probe %s answered %d", g.Path, resp.StatusCode)
		}
		return nil
	case p.TCPSocket != nil:
		port, err := t.port(p.TCPSocket.Port)
		if err != nil {
			return err
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(podIP, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return c.Close()
	}
	return errors.New("only httpGet and tcpSocket probes are supported by the local pod runner")
}

// probeLoop runs a probe until ctx ends, applying its thresholds. Each time the
// result flips, report is called. initial is the result before any probe ran:
// false for readiness, true for liveness.
func (t probeTarget) probeLoop(ctx context.Context, p *corev1.Probe, initial, fastStart bool, report func(ok bool, err error)) {
	period := time.Duration(max(p.PeriodSeconds, 1)) * time.Second
	success, failure := max(p.SuccessThreshold, 1), max(p.FailureThreshold, 1)
	if !sleepCtx(ctx, time.Duration(p.InitialDelaySeconds)*time.Second) {
		return
	}
	state, everOK := initial, false
	var oks, fails int32
	for {
		err := t.check(ctx, p)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			oks, fails, everOK = oks+1, 0, true
			if !state && oks >= success {
				state = true
				report(true, nil)
			}
		} else {
			oks, fails = 0, fails+1
			if state && fails >= failure {
				state = false
				report(false, err)
			}
		}
		wait := period
		if fastStart && !everOK {
			wait = min(period, fastProbe)
		}
		if !sleepCtx(ctx, wait) {
			return
		}
	}
}

// sleepCtx sleeps for d unless ctx ends first; it reports whether it slept.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
