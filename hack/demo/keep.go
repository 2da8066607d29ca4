package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/localenv"
)

// keepNode is keep on a real node.
func keepNode(ctx context.Context, p *out, env *localenv.Env, bin, dir, url string) error {
	ns := filepath.Base(env.Cluster.Netns)
	fmt.Fprintf(p.w, `
  export KUBECONFIG=%s
  export PATH=%s:$PATH    # the kubectl built with the envtest binaries

  kubectl get nodes,pods -A -o wide
  kubectl get pods -n %s -w
  kubectl logs -n %s deployment/%s-reserve -f
  kubectl logs -n %s deployment/flashsale-controller-manager
  kubectl patch flashsale %s -n %s --type merge -p '{"spec":{"paused":true}}'

  reservation API (Service %s/%s-reserve, ClusterIP, inside the node's network namespace): %s
  ip netns exec %s %s storm --url %s --buyers 1000 --sku itm-ps5-pro --key-file %s ...
`, env.Kubeconfig, filepath.Dir(env.KubectlBin), namespace, namespace, saleName, localenv.ManagerNamespace, saleName, namespace,
		namespace, saleName, url, ns, rel(bin), url, rel(filepath.Join(dir, "hmac-key")))
	<-ctx.Done()
	fmt.Fprintln(p.w)
	return nil
}

// keep leaves everything running until Ctrl-C and says how to reach it.
func keep(ctx context.Context, p *out, env *localenv.Env, bin, dir, url string) error {
	p.section("Still running (--keep): press Ctrl-C to tear everything down")
	if env.Cluster != nil {
		return keepNode(ctx, p, env, bin, dir, url)
	}
	fmt.Fprintf(p.w, `
  export KUBECONFIG=%s
  export PATH=%s:$PATH    # the kubectl built with the envtest binaries

  kubectl get flashsales -n %s -w
  kubectl get deployments,services,events -n %s
  kubectl patch flashsale %s -n %s --type merge -p '{"spec":{"paused":true}}'

  reservation API (Service %s/%s-reserve): %s
  curl %s/api/v1/flash-sale/items/itm-ps5-pro/availability
  TOKEN=$(%s token --sku itm-ps5-pro --user alice --key-file %s)
  curl -H "Authorization: Bearer $TOKEN" -d '{"item_id":"itm-ps5-pro","user_id":"alice","quantity":1,"idempotency_key":"k1"}' %s/api/v1/flash-sale/reserve

  pod runner: %s (GET /state); replica logs in %s
`, env.Kubeconfig, filepath.Dir(env.KubectlBin), namespace, namespace, saleName, namespace,
		namespace, saleName, url, url, rel(bin), rel(filepath.Join(dir, "hmac-key")), url,
		env.RunnerAPI.URL, filepath.Join(env.RunnerDir, "logs"))
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(p.w)
			return nil
		case <-time.After(time.Second):
		}
		for _, proc := range []*localenv.Process{env.Manager, env.Runner} {
			if proc.Exited() {
				return fmt.Errorf("%s (pid %d) exited; see %s", proc.Name, proc.PID(), proc.Log)
			}
		}
	}
}

// indent prefixes each line a child writes, so its output sits inside the step.
func indent(w io.Writer) io.Writer { return &indenter{w: w, bol: true} }

type indenter struct {
	w   io.Writer
	bol bool
}

func (in *indenter) Write(b []byte) (int, error) {
	var buf []byte
	for _, c := range b {
		if in.bol {
			buf = append(buf, "    "...)
		}
		buf = append(buf, c)
		in.bol = c == '\n'
	}
	if _, err := in.w.Write(buf); err != nil {
		return 0, err
	}
	return len(b), nil
}
