package podrunner

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Pod is one replica as the runner reports it.
type Pod struct {
	Namespace  string `json:"namespace"`
	Deployment string `json:"deployment"`
	Name       string `json:"name"`
	// Index is the replica's position among its Deployment's current replicas:
	// the index Kill takes. Replicas being stopped have -1.
	Index     int    `json:"index"`
	Phase     string `json:"phase"`
	PID       int    `json:"pid,omitempty"`
	Address   string `json:"address,omitempty"` // 127.0.0.1:port it listens on
	Ready     bool   `json:"ready"`
	Restarts  int    `json:"restarts"`
	LastExit  string `json:"lastExit,omitempty"`
	LastError string `json:"lastError,omitempty"`
	Log       string `json:"log"`
}

// Service is one exposed service port.
type Service struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Port      int32    `json:"port"` // the Service's port
	PortName  string   `json:"portName,omitempty"`
	Address   string   `json:"address"` // where the runner exposes it
	URL       string   `json:"url"`
	Endpoints []string `json:"endpoints"` // ready replicas behind it
}

// State is what runs: the state file and the admin endpoint's GET /state.
type State struct {
	Admin    string    `json:"admin,omitempty"`
	Services []Service `json:"services"`
	Pods     []Pod     `json:"pods"`
}

// ServiceURL returns the URL of a Service's port (0: its first port).
func (s State) ServiceURL(namespace, name string, port int32) (string, bool) {
	for _, sv := range s.Services {
		if sv.Namespace == namespace && sv.Name == name && (port == 0 || sv.Port == port) {
			return sv.URL, true
		}
	}
	return "", false
}

// PodsOf returns the current replicas of a Deployment, in Index order.
func (s State) PodsOf(namespace, deployment string) []Pod {
	var out []Pod
	for _, p := range s.Pods {
		if p.Namespace == namespace && p.Deployment == deployment && p.Index >= 0 {
			out = append(out, p)
		}
	}
	return out
}

// State reports the replicas and the exposed Services.
func (r *Runner) State() State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stateValueLocked()
}

func (r *Runner) stateValueLocked() State {
	st := State{Admin: r.cfg.AdminURL, Services: []Service{}, Pods: []Pod{}}
	pod := func(rp *replica, index int) Pod {
		s := rp.snapshot()
		p := Pod{
			Namespace: rp.namespace, Deployment: rp.deployment, Name: rp.name, Index: index,
			Phase: s.phase, PID: s.pid, Ready: s.ready, Restarts: s.restarts,
			LastExit: s.lastExit, LastError: s.lastError, Log: rp.logPath,
		}
		if s.pid != 0 {
			p.Address = podIP + ":" + strconv.Itoa(s.port)
		}
		return p
	}
	for _, d := range r.deps {
		for i, rp := range d.replicas {
			st.Pods = append(st.Pods, pod(rp, i))
		}
	}
	for _, rp := range r.retired {
		st.Pods = append(st.Pods, pod(rp, -1))
	}
	sort.SliceStable(st.Pods, func(i, j int) bool {
		a, b := st.Pods[i], st.Pods[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Deployment != b.Deployment {
			return a.Deployment < b.Deployment
		}
		if (a.Index < 0) != (b.Index < 0) {
			return b.Index < 0
		}
		if a.Index != b.Index {
			return a.Index < b.Index
		}
		return a.Name < b.Name
	})
	for _, s := range r.svcs {
		for _, p := range s.proxies {
			eps := r.endpointsLocked(p)
			if eps == nil {
				eps = []string{}
			}
			st.Services = append(st.Services, Service{
				Namespace: s.namespace, Name: s.name, Port: p.port.Port, PortName: p.port.Name,
				Address: p.addr(), URL: "http://" + p.addr(), Endpoints: eps,
			})
		}
	}
	sort.Slice(st.Services, func(i, j int) bool {
		a, b := st.Services[i], st.Services[j]
		if a.Namespace+"/"+a.Name != b.Namespace+"/"+b.Name {
			return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
		}
		return a.Port < b.Port
	})
	return st
}

func (r *Runner) stateLocked() []byte {
	b, _ := json.MarshalIndent(r.stateValueLocked(), "", "  ")
	return append(b, '\n')
}

// Handler is the runner's admin API, to be served on 127.0.0.1 only:
//
//	GET  /state                                    State as JSON
//	POST /kill?namespace=NS&deployment=D&index=I   SIGKILL a replica; answers {"pid": N}
//	GET  /healthz
func (r *Runner) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /state", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, r.State())
	})
	mux.HandleFunc("POST /kill", func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		index, err := strconv.Atoi(q.Get("index"))
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "index must be an integer"})
			return
		}
		pid, err := r.Kill(q.Get("namespace"), q.Get("deployment"), index)
		if err != nil {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]int{"pid": pid})
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Client talks to a runner's admin API.
type Client struct {
	URL  string // e.g. http://127.0.0.1:34567
	HTTP *http.Client
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return &http.Client{Timeout: 10 * time.Second}
}

// State fetches the runner's state.
func (c *Client) State(ctx context.Context) (State, error) {
	var st State
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(c.URL, "/")+"/state", nil)
	if err != nil {
		return st, err
	}
	return st, c.do(req, &st)
}

// Kill SIGKILLs replica index of a Deployment and returns the pid killed.
func (c *Client) Kill(ctx context.Context, namespace, deployment string, index int) (int, error) {
	q := url.Values{"namespace": {namespace}, "deployment": {deployment}, "index": {strconv.Itoa(index)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.URL, "/")+"/kill?"+q.Encode(), nil)
	if err != nil {
		return 0, err
	}
	var out struct {
		PID int `json:"pid"`
	}
	return out.PID, c.do(req, &out)
}

func (c *Client) do(req *http.Request, out any) error {
	resp, err := c.http().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		if e.Error == "" {
			e.Error = strings.TrimSpace(string(b))
		}
		return fmt.Errorf("pod runner %s %s: %d: %s", req.Method, req.URL.Path, resp.StatusCode, e.Error)
	}
	return json.Unmarshal(b, out)
}

// ReadState reads a runner's state file.
func ReadState(path string) (State, error) {
	var st State
	b, err := os.ReadFile(path)
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(b, &st)
}

// Kill sends SIGKILL to a replica's process, as a crash would, and returns its
// pid; the runner restarts it like any crashed replica. index is the position
// of the replica among the Deployment's current replicas (0 = lowest slot), as
// listed by Pods.
func (r *Runner) Kill(namespace, deployment string, index int) (int, error) {
	r.mu.Lock()
	st := r.deps[namespace+"/"+deployment]
	if st == nil {
		r.mu.Unlock()
		return 0, fmt.Errorf("no deployment %s/%s is run here", namespace, deployment)
	}
	if index < 0 || index >= len(st.replicas) {
		n := len(st.replicas)
		r.mu.Unlock()
		return 0, fmt.Errorf("deployment %s/%s has %d replicas: no index %d", namespace, deployment, n, index)
	}
	rp := st.replicas[index]
	r.mu.Unlock()

	rp.mu.Lock()
	defer rp.mu.Unlock()
	if rp.proc == nil || rp.proc.exited() {
		return 0, fmt.Errorf("replica %s is not running (%s)", rp.name, rp.phase)
	}
	rp.proc.signal(sigKill)
	r.log.Info("replica killed on request", "pod", rp.namespace+"/"+rp.name, "pid", rp.proc.pid())
	return rp.proc.pid(), nil
}
