package node_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// readyEndpoints lists the Service's endpoints by readiness, from its
// EndpointSlices (what kube-proxy routes to).
func readyEndpoints(t *testing.T, ns, svc string) (ready, notReady []string) {
	t.Helper()
	var list struct {
		Items []struct {
			Endpoints []struct {
				Addresses  []string `json:"addresses"`
				Conditions struct {
					Ready *bool `json:"ready"`
				} `json:"conditions"`
			} `json:"endpoints"`
		} `json:"items"`
	}
	out := kubectl(t, nil, "get", "endpointslices", "-n", ns, "-l", "kubernetes.io/service-name="+svc, "-o", "json")
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	for _, it := range list.Items {
		for _, ep := range it.Endpoints {
			if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
				ready = append(ready, ep.Addresses...)
			} else {
				notReady = append(notReady, ep.Addresses...)
			}
		}
	}
	return ready, notReady
}

// podIPs maps the reserve pods' names to their IPs.
func podIPs(t *testing.T, ns string) map[string]string {
	t.Helper()
	out := kubectl(t, nil, "get", "pods", "-n", ns, "-l", "app.kubernetes.io/component=reserve", "-o",
		`jsonpath={range .items[*]}{.metadata.name} {.status.podIP}{"\n"}{end}`)
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			m[f[0]] = f[1]
		}
	}
	return m
}

// With the sale's Redis down, a reserve pod that starts (the replacement of
// a deleted one) is never ready, so the Service's endpoints keep only the pod
// that was (it stays ready by
// design and answer 503 with Retry-After, a documented answer, rather than
// leaving buyers with refused connections); once Redis is back the sale is
// rebuilt and two ready pods serve again.
func TestEndpointsHoldOnlyReadyPodsWhileRedisIsDown(t *testing.T) {
	needNode(t)
	ns := "endpoints"
	newShop(t, ns)
	own, _ := ownRedis(t, ns)
	s := applySale(t, ns, map[string]any{"Name": "eps", "Allocation": 100, "Replicas": 2, "Memory": "64Mi", "RedisSecret": "own-redis"})
	svc := "eps-reserve"
	kubectl(t, nil, "rollout", "status", "deployment/eps-reserve", "-n", ns, "--timeout=170s")
	eventually(t, "both reserve pods ready endpoints", func() bool {
		ready, _ := readyEndpoints(t, ns, svc)
		return len(ready) == 2
	})
	before := podIPs(t, ns)

	if err := own.Kill(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	// Cleanups run last first: Redis is back before the sale is deleted.
	t.Cleanup(func() {
		if !restarted {
			_ = own.Start()
		}
	})
	// One pod goes; its ReplicaSet starts a replacement while Redis is down.
	var gone string
	for name := range before {
		gone = name
		break
	}
	kubectl(t, nil, "delete", "pod", gone, "-n", ns, "--wait=false")
	delete(before, gone)
	var newPod, newIP string
	eventually(t, "a replacement reserve pod with an IP", func() bool {
		for name, ip := range podIPs(t, ns) {
			if _, old := before[name]; !old && ip != "" {
				newPod, newIP = name, ip
			}
		}
		return newPod != ""
	})
	// The kubelet probes it and keeps it out: the slice lists it not ready.
	eventually(t, "the new pod listed as not ready", func() bool {
		_, notReady := readyEndpoints(t, ns, svc)
		for _, ip := range notReady {
			if ip == newIP {
				return true
			}
		}
		return false
	})
	ready, _ := readyEndpoints(t, ns, svc)
	for _, ip := range ready {
		if ip == newIP {
			t.Fatalf("pod %s (%s) is a ready endpoint with its Redis down", newPod, newIP)
		}
	}
	eventually(t, "the deleted pod out of the endpoints", func() bool {
		ready, _ = readyEndpoints(t, ns, svc)
		return len(ready) == 1
	})
	for _, ip := range before {
		if len(ready) != 1 || ready[0] != ip {
			t.Errorf("ready endpoints %v during the outage, want only the pod that was ready (%s)", ready, ip)
		}
	}
	// Through kube-proxy, the Service answers a documented 503.
	client := env.HTTPClient(10 * time.Second)
	resp, err := client.Get(s.url + "/api/v1/flash-sale/items/" + s.sku + "/availability")
	if err != nil {
		t.Fatalf("GET availability through the Service during the outage: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable && resp.StatusCode != http.StatusOK {
		t.Errorf("availability during the outage: %d, want 503 (or 200 from a cached read)", resp.StatusCode)
	}

	if err := own.Start(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	// Redis came back empty: the operator rebuilds the stock from the
	// ledger (a new epoch) and rolls the pods; the Service ends with two
	// ready endpoints and none that is not.
	eventuallyWithin(t, 4*time.Minute, "two ready endpoints once Redis is back", func() bool {
		ready, notReady := readyEndpoints(t, ns, svc)
		return len(ready) == 2 && len(notReady) == 0
	})
}
