package node_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/test/internal/salecheck"
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

// replaceOnePod deletes one of the Service's two ready reserve pods while a
// server the pods need is down: its ReplicaSet's replacement must be listed
// not ready, never ready, and the Service must end with only the pod that
// stayed ready (by design: it answers 503 with Retry-After, a documented
// answer, rather than leaving buyers with refused connections).
func replaceOnePod(t *testing.T, ns, svc string) {
	t.Helper()
	before := podIPs(t, ns)
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
			t.Fatalf("pod %s (%s) is a ready endpoint while its server is down", newPod, newIP)
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
}

// twoReadyEndpoints waits for the sale's two reserve pods to be the Service's
// only endpoints, both ready.
func twoReadyEndpoints(t *testing.T, ns, svc string, timeout time.Duration) {
	t.Helper()
	eventuallyWithin(t, timeout, "two ready endpoints and none that is not", func() bool {
		ready, notReady := readyEndpoints(t, ns, svc)
		return len(ready) == 2 && len(notReady) == 0
	})
}

// twoReplicaSale applies a sale of two reserve replicas (vars add its Secrets)
// and waits for both to be the Service's ready endpoints.
func twoReplicaSale(t *testing.T, ns, name string, vars map[string]any) (s *sale, svc string) {
	t.Helper()
	all := map[string]any{"Name": name, "Allocation": 100, "Replicas": 2, "Memory": "64Mi"}
	maps.Copy(all, vars)
	s = applySale(t, ns, all)
	svc = name + "-reserve"
	kubectl(t, nil, "rollout", "status", "deployment/"+svc, "-n", ns, "--timeout=170s")
	twoReadyEndpoints(t, ns, svc, 2*time.Minute)
	return s, svc
}

// serverDown stops a server the sale's pods need and returns what starts it
// again. A test that ends before then gets it back in a cleanup, which runs
// before the sale's own (last first), so the sale is deleted with it up.
func serverDown(t *testing.T, stop, start func() error) (restore func()) {
	t.Helper()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	restored := false
	t.Cleanup(func() {
		if !restored {
			_ = start()
		}
	})
	return func() {
		t.Helper()
		if err := start(); err != nil {
			t.Fatal(err)
		}
		restored = true
	}
}

// With the sale's Redis down, a reserve pod that starts is never ready (see
// replaceOnePod); once Redis is back the sale is rebuilt and two ready pods
// serve again.
func TestEndpointsHoldOnlyReadyPodsWhileRedisIsDown(t *testing.T) {
	needNode(t)
	ns := "endpoints"
	newShop(t, ns)
	own, _ := ownRedis(t, ns)
	s, svc := twoReplicaSale(t, ns, "eps", map[string]any{"RedisSecret": "own-redis"})

	restore := serverDown(t, own.Kill, own.Start)
	replaceOnePod(t, ns, svc)
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

	restore()
	// Redis came back empty: the operator rebuilds the stock from the
	// ledger (a new epoch) and rolls the pods.
	twoReadyEndpoints(t, ns, svc, 4*time.Minute)
}

// ownLedger starts a PostgreSQL for one sale of namespace ns (one the test
// may stop without touching another sale), forwards it into the node, and
// creates the Secret own-ledger (key dsn) that points the sale's pods and
// the manager at it (testdata/sale.yaml's LedgerSecret). It returns the
// server and its DSN from this machine.
func ownLedger(t *testing.T, ns string) (*testharness.Postgres, string) {
	t.Helper()
	pg, dsn, err := env.StartPostgres(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if u.Host, err = env.PodAddr(u.Host); err != nil {
		t.Fatal(err)
	}
	kubectl(t, nil, "create", "secret", "generic", "own-ledger", "-n", ns, "--from-literal=dsn="+u.String())
	return pg, dsn
}

// With the sale's ledger down, a reserve pod that starts is never ready (see
// replaceOnePod) and the pod that stays ready answers every reservation
// through kube-proxy with a 503, acknowledging none it could not record;
// once the ledger is back, two ready pods serve again and a buyer's retry is
// recorded.
func TestEndpointsHoldOnlyReadyPodsWhileTheLedgerIsDown(t *testing.T) {
	needNode(t)
	ns := "endpoints-ledger"
	newShop(t, ns)
	pg, dsn := ownLedger(t, ns)
	s, svc := twoReplicaSale(t, ns, "epl", map[string]any{"LedgerSecret": "own-ledger"})

	restore := serverDown(t, pg.Stop, pg.Start)
	replaceOnePod(t, ns, svc)
	c := s.check()
	for i := range 5 {
		if a := c.Buyer(t, fmt.Sprintf("while-down-%d", i)).Reserve(t, "k1"); a.Status != http.StatusServiceUnavailable {
			t.Errorf("reserve through the Service with the ledger down: %d %s, want 503", a.Status, a.Code)
		}
	}

	restore()
	twoReadyEndpoints(t, ns, svc, 3*time.Minute)
	// A buyer retrying the same key, as the 503's Retry-After says, is
	// served once the pods see the ledger again, and recorded there.
	buyer := c.Buyer(t, "after")
	var got salecheck.Answer
	eventually(t, "a reservation once the ledger is back", func() bool {
		got = buyer.Reserve(t, "k1")
		return got.Status == http.StatusCreated
	})
	q, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if st := salecheck.Statuses(t, q, []string{got.ReservationID}); st[got.ReservationID] != "PENDING" {
		t.Fatalf("the reservation made after the outage is %q in the sale's ledger, want PENDING", st[got.ReservationID])
	}
}
