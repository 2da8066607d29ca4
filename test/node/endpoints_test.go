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

// With the sale's Redis down, a reserve pod that starts is never ready, so
// the Service's endpoints keep only the pods that were (they stay ready by
// design and answer 503 with Retry-After, a documented answer, rather than
// leaving buyers with refused connections); once Redis is back the new pod
// turns ready and joins.
func TestEndpointsHoldOnlyReadyPodsWhileRedisIsDown(t *testing.T) {
	needNode(t)
	ns := "endpoints"
	newShop(t, ns)
	own, err := env.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	podRedis, err := env.PodAddr(own.Addr())
	if err != nil {
		t.Fatal(err)
	}
	kubectl(t, nil, "create", "secret", "generic", "own-redis", "-n", ns, "--from-literal=addresses="+podRedis)
	s := applySale(t, ns, map[string]any{"Name": "eps", "Allocation": 100, "Replicas": 2, "Memory": "64Mi", "RedisSecret": "own-redis"})
	svc := "eps-reserve"
	before := podIPs(t, ns)
	if ready, _ := readyEndpoints(t, ns, svc); len(ready) != 2 {
		t.Fatalf("ready endpoints %v before the outage, want the 2 pods %v", ready, before)
	}

	if err := own.Kill(); err != nil {
		t.Fatal(err)
	}
	kubectl(t, nil, "patch", "flashsale", "eps", "-n", ns, "--type", "merge", "-p", `{"spec":{"reservation":{"replicas":3}}}`)
	var newPod, newIP string
	eventually(t, "a third reserve pod with an IP", func() bool {
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
	if len(ready) != 2 {
		t.Errorf("ready endpoints %v during the outage, want the 2 pods that were ready", ready)
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
	eventually(t, "the new pod ready once Redis is back", func() bool {
		ready, _ := readyEndpoints(t, ns, svc)
		for _, ip := range ready {
			if ip == newIP {
				return len(ready) == 3
			}
		}
		return false
	})
}
