package localenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

// ManagerNamespace is where config/default puts the operator.
const ManagerNamespace = "flashsale-system"

// managerDeployment is the operator's Deployment in config/default.
const managerDeployment = "flashsale-controller-manager"

// startNode is Start on a real node: the cluster (API server, controllers,
// containerd, kubelet, kube-proxy) from internal/testharness, Redis and
// PostgreSQL on this machine's loopback, forwarded into the node's
// namespace for the pods, the images built and loaded, and the operator
// deployed from config/default as a pod of its image.
func (e *Env) startNode(ctx context.Context, step func(string, func() error) error) error {
	if err := step("images (operator and pause, OCI archives)", func() error {
		dir := filepath.Join(e.Dir, "images")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		op, _, err := testharness.BuildImages(dir)
		if err != nil {
			return err
		}
		e.imageArchive = op
		// The static binary in the image is the one storms and tokens run.
		e.Binary = filepath.Join(dir, "flashsale")
		return nil
	}); err != nil {
		return err
	}
	if err := step("node: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd, kubelet, kube-proxy", func() error {
		c, err := testharness.StartCluster()
		if err != nil {
			return err
		}
		e.Cluster, e.Kube, e.KubectlBin = c, c.Kube, c.KubectlBin
		e.Kubeconfig = filepath.Join(e.Dir, "kubeconfig")
		b, err := os.ReadFile(c.Kubeconfig)
		if err != nil {
			return err
		}
		if err := os.WriteFile(e.Kubeconfig, b, 0o600); err != nil {
			return err
		}
		return c.LoadImage(e.imageArchive)
	}); err != nil {
		return err
	}
	if err := e.startServers(ctx, step); err != nil {
		return err
	}
	if err := step("pods reach Redis and PostgreSQL at the node's address", func() error {
		var err error
		if e.podRedis, err = e.Cluster.Expose(e.Redis.Addr()); err != nil {
			return err
		}
		pg, err := e.Cluster.Expose(net.JoinHostPort("127.0.0.1", strconv.Itoa(e.Postgres.Port())))
		if err != nil {
			return err
		}
		u, err := url.Parse(e.DSN)
		if err != nil {
			return err
		}
		u.Host = pg
		e.PodDSN = u.String()
		return nil
	}); err != nil {
		return err
	}
	return step("operator (config/default, flashsale manager as a pod)", func() error { return e.deployManager(ctx) })
}

// managerManifests renders config/default with kubectl's kustomize and points
// it at the local image and this node's API server address.
func (e *Env) managerManifests(ctx context.Context) ([]byte, error) {
	out, err := e.Kubectl(ctx, nil, "kustomize", filepath.Join(testharness.RepoRoot(), "config", "default"))
	if err != nil {
		return nil, err
	}
	var docs [][]byte
	for _, doc := range strings.Split(out, "\n---\n") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			return nil, err
		}
		if obj["kind"] == "Deployment" {
			if err := e.patchManager(obj); err != nil {
				return nil, err
			}
		}
		b, err := yaml.Marshal(obj)
		if err != nil {
			return nil, err
		}
		docs = append(docs, b)
	}
	return bytes.Join(docs, []byte("---\n")), nil
}

// patchManager sets the image (a :latest tag would make the kubelet pull),
// the status refresh, and the API server's address: its serving certificate
// names NodeIP, not the kubernetes Service's ClusterIP.
func (e *Env) patchManager(obj map[string]any) error {
	spec, _ := obj["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	pod, _ := tmpl["spec"].(map[string]any)
	containers, _ := pod["containers"].([]any)
	if len(containers) != 1 {
		return fmt.Errorf("the manager Deployment has %d containers, want 1", len(containers))
	}
	c := containers[0].(map[string]any)
	c["image"] = e.opts.Image
	c["imagePullPolicy"] = "Never"
	args, _ := c["args"].([]any)
	c["args"] = append(args, "--status-refresh="+e.opts.StatusRefresh.String())
	env, _ := c["env"].([]any)
	for i, v := range env {
		if m, ok := v.(map[string]any); ok && m["name"] == "FLASHSALE_IMAGE" {
			env[i] = map[string]any{"name": "FLASHSALE_IMAGE", "value": e.opts.Image}
		}
	}
	c["env"] = append(env,
		map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": e.Cluster.NodeIP},
		map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": "6443"})
	return nil
}

func (e *Env) deployManager(ctx context.Context) error {
	manifests, err := e.managerManifests(ctx)
	if err != nil {
		return err
	}
	if _, err := e.Kubectl(ctx, manifests, "apply", "--server-side", "-f", "-"); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := e.Kubectl(wctx, nil, "rollout", "status", "-n", ManagerNamespace, "deployment/"+managerDeployment, "--timeout=170s"); err != nil {
		logs, _ := e.Kubectl(context.Background(), nil, "logs", "-n", ManagerNamespace, "deployment/"+managerDeployment, "--tail=30")
		pods, _ := e.Kubectl(context.Background(), nil, "get", "pods", "-A", "-o", "wide")
		return fmt.Errorf("%w\npods:\n%s\nmanager log:\n%s", err, pods, logs)
	}
	return nil
}

// Command prepares a command that reaches what the pods reach: on a real
// node it runs inside the node's network namespace.
func (e *Env) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	if e.Cluster != nil {
		return e.Cluster.Command(ctx, name, args...)
	}
	return exec.CommandContext(ctx, name, args...)
}

// HTTPClient reaches ServiceURL's addresses.
func (e *Env) HTTPClient(timeout time.Duration) *http.Client {
	if e.Cluster != nil {
		return e.Cluster.HTTPClient(timeout)
	}
	return &http.Client{Timeout: timeout}
}

// serviceURLOnNode waits for the Service to have a ready endpoint and returns
// its ClusterIP URL (reached through kube-proxy).
func (e *Env) serviceURLOnNode(ctx context.Context, namespace, name string) (string, error) {
	for {
		out, err := e.Kubectl(ctx, nil, "get", "service", name, "-n", namespace, "-o", "jsonpath={.spec.clusterIP} {.spec.ports[0].port}")
		f := strings.Fields(out)
		if err == nil && len(f) == 2 {
			eps, err := e.Kubectl(ctx, nil, "get", "endpointslices", "-n", namespace, "-l", "kubernetes.io/service-name="+name,
				"-o", `jsonpath={.items[*].endpoints[?(@.conditions.ready==true)].addresses[0]}`)
			if err == nil && strings.TrimSpace(eps) != "" {
				// The endpoint is ready in the API before kube-proxy has
				// written its rules, and a connection attempted before them
				// keeps its conntrack entry without the NAT, so its retries
				// never arrive: a client's first request then times out.
				// A connection that opens says the rules are in.
				addr := net.JoinHostPort(f[0], f[1])
				if err = dialOnce(ctx, addr); err == nil {
					return "http://" + addr, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("service %s/%s has no ready endpoint: %w", namespace, name, errors.Join(ctx.Err(), err))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// dialOnce opens and closes a connection to addr, giving up after a second
// (each attempt comes from a new port, so a new conntrack entry).
func dialOnce(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return c.Close()
}

// PodAddr is where pods reach a server of this machine's loopback (a Redis
// from StartRedis): forwarded into the node's namespace on a real node, the
// address itself otherwise.
func (e *Env) PodAddr(hostAddr string) (string, error) {
	if e.Cluster != nil {
		return e.Cluster.Expose(hostAddr)
	}
	return hostAddr, nil
}
