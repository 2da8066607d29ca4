package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/admission"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/stock"
)

// Real servers, started once for the package by the first test that needs them,
// so that the fuzz targets (and their workers) run without them.
var (
	sharedRedis *testharness.Redis
	sharedPG    *testharness.Postgres
)

func TestMain(m *testing.M) {
	testharness.Main(m, func() error { return nil })
}

func startShared(t testing.TB) {
	t.Helper()
	sharedRedis, sharedPG = testharness.Shared(t)
}

const testSKU = "itm-ps5-pro" // the SKU of the examples in docs/openapi.yaml

var testKey = []byte("test-admission-key-0123456789")

// fixture is one FlashSale on a fresh ledger database, served over real HTTP.
type fixture struct {
	t      testing.TB
	e      *engine.Engine
	l      *ledger.Ledger
	rdb    redis.UniversalClient
	srv    *Server
	base   string
	client *http.Client
	epoch  int64

	redisCmds atomic.Int64 // commands this process sent to Redis
	stop      func() error // cancels Serve and returns its result
}

type fixtureConfig struct {
	engine  engine.Config
	api     Config
	mat     ledger.MaterializerConfig
	cluster []string // Redis Cluster addresses; none: redis, or the shared standalone Redis
	redis   string   // a standalone Redis of the test's own
}

type option func(*fixtureConfig)

func withAllocation(n int64) option { return func(c *fixtureConfig) { c.engine.Allocation = n } }
func withShards(n int) option       { return func(c *fixtureConfig) { c.engine.Shards = n } }
func withMaxPerUser(n int) option   { return func(c *fixtureConfig) { c.engine.MaxPerUser = n } }
func withTTL(d time.Duration) option {
	return func(c *fixtureConfig) { c.engine.TTL = d }
}
func withRateLimit(perSecond float64, burst int) option {
	return func(c *fixtureConfig) { c.api.RateLimit, c.api.RateBurst = perSecond, burst }
}
func withMaterializer(m ledger.MaterializerConfig) option {
	return func(c *fixtureConfig) { c.mat = m }
}
func withWriteTimeout(d time.Duration) option {
	return func(c *fixtureConfig) { c.api.WriteTimeout = d }
}
func withDrainDelay(d time.Duration) option {
	return func(c *fixtureConfig) { c.api.DrainDelay = d }
}
func withCluster(addrs []string) option { return func(c *fixtureConfig) { c.cluster = addrs } }
func withRedis(addr string) option      { return func(c *fixtureConfig) { c.redis = addr } }

func randomID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// countingHook counts what the server sends to Redis, to prove that rejected
// requests never get there. A connection's set-up (HELLO, CLIENT SETINFO),
// which go-redis sends whenever its pool opens one, is not counted.
type countingHook struct{ n *atomic.Int64 }

func (h countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.count(cmd); return next(ctx, cmd) }
}
func (h countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.count(c)
		}
		return next(ctx, cmds)
	}
}
func (h countingHook) count(cmd redis.Cmder) {
	if n := cmd.Name(); n != "hello" && n != "client" {
		h.n.Add(1)
	}
}

func newFixture(t testing.TB, opts ...option) *fixture {
	t.Helper()
	fc := fixtureConfig{
		engine: engine.Config{
			CampaignID: "c-" + randomID(), Namespace: "shop", Name: "drop", SKU: testSKU,
			Allocation: 100, Shards: 4, MaxPerUser: 2, TTL: time.Minute, StealProbes: 2,
			IDSecret: []byte("0123456789abcdef0123456789abcdef"),
		},
		api: Config{AdmissionKey: testKey},
	}
	for _, o := range opts {
		o(&fc)
	}
	ctx := context.Background()
	startShared(t)
	dsn, err := sharedPG.NewDatabase()
	if err != nil {
		t.Fatal(err)
	}
	l, err := ledger.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	f := &fixture{t: t, l: l}
	if len(fc.cluster) > 0 {
		f.rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: fc.cluster, PoolSize: 64})
	} else {
		addr := sharedRedis.Addr()
		if fc.redis != "" {
			addr = fc.redis
		}
		f.rdb = redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	}
	t.Cleanup(func() { _ = f.rdb.Close() })
	metrics := NewMetrics()
	stock.AddHook(f.rdb, metrics.RedisHook())
	stock.AddHook(f.rdb, countingHook{&f.redisCmds})
	fc.mat.OnBatch = metrics.ObserveBatch
	f.e, err = engine.New(fc.engine, f.rdb, l, fc.mat)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.e.Close)
	// The controller's part: the ledger row and the seeded shards.
	seed, err := f.e.Seed(ctx, stock.StateOpen)
	if err != nil {
		t.Fatal(err)
	}
	f.epoch = seed.Campaign.Epoch

	fc.api.Engine, fc.api.Metrics = f.e, metrics
	f.srv, err = New(fc.api)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.base = "http://" + ln.Addr().String()
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.srv.Serve(sctx, ln) }()
	var stopped atomic.Bool
	var result error
	f.stop = func() error {
		if stopped.CompareAndSwap(false, true) {
			cancel()
			result = <-done
		}
		return result
	}
	t.Cleanup(func() { _ = f.stop() })
	f.client = &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 128},
		// A redirect is an answer to check, not to follow.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	t.Cleanup(f.client.CloseIdleConnections)
	return f
}

func (f *fixture) token(user string) string {
	return f.tokenFor(testSKU, user, 10*time.Minute)
}

func (f *fixture) tokenFor(sku, user string, ttl time.Duration) string {
	f.t.Helper()
	tok, err := admission.Mint(testKey, sku, user, ttl, time.Now())
	if err != nil {
		f.t.Fatal(err)
	}
	return tok
}

// response is what one HTTP call returned.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
}

func (r response) errorBody(t testing.TB) ErrorBody {
	t.Helper()
	var e ErrorBody
	r.decode(t, &e)
	return e
}

// call sends a request; body is sent as is when it is a string or []byte, else as JSON.
func (f *fixture) call(method, path, token string, body any) response {
	f.t.Helper()
	r, err := f.tryCall(method, path, token, body)
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

func (f *fixture) tryCall(method, path, token string, body any) (response, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		js, err := json.Marshal(b)
		if err != nil {
			return response{}, err
		}
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequest(method, f.base+path, rd)
	if err != nil {
		return response{}, err
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b}, err
}

const (
	reservePath  = "/api/v1/flash-sale/reserve"
	checkoutPath = "/api/v1/flash-sale/checkout"
)

func cancelPath(id string) string { return "/api/v1/flash-sale/reservations/" + id }

func availabilityPath(item string) string {
	return "/api/v1/flash-sale/items/" + item + "/availability"
}

func reserveBody(user, key string, qty int) map[string]any {
	return map[string]any{"item_id": testSKU, "user_id": user, "quantity": qty, "idempotency_key": key}
}

// reserve places a reservation and insists on 201.
func (f *fixture) reserve(user, key string, qty int) ReservationBody {
	f.t.Helper()
	r := f.call(http.MethodPost, reservePath, f.token(user), reserveBody(user, key, qty))
	if r.status != http.StatusCreated {
		f.t.Fatalf("reserve %s/%s: %d %s", user, key, r.status, r.body)
	}
	var b ReservationBody
	r.decode(f.t, &b)
	return b
}

func (f *fixture) checkout(user, id, payment string) response {
	f.t.Helper()
	return f.call(http.MethodPost, checkoutPath, f.token(user), map[string]any{"reservation_id": id, "payment_token": payment})
}

func (f *fixture) counts() engine.Counts {
	f.t.Helper()
	c, err := f.e.Counts(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// assertConserved checks I1 and I2 and that the ledger's PENDING units match
// Redis's reserved units.
func (f *fixture) assertConserved() engine.Counts {
	f.t.Helper()
	c := f.counts()
	if c.Oversold() > 0 || !c.Conserved() || c.Pending != c.Reserved {
		f.t.Fatalf("audit: available %d + reserved %d + sold %d vs allocation %d, pending %d", c.Available, c.Reserved, c.Sold, c.Allocation, c.Pending)
	}
	return c
}

// sameCounts compares the audit figures that any state change would move.
func sameCounts(a, b engine.Counts) bool {
	return a.Available == b.Available && a.Reserved == b.Reserved && a.Sold == b.Sold &&
		a.Pending == b.Pending && a.Allocation == b.Allocation && a.Epoch == b.Epoch
}

func (f *fixture) setGate(state string) {
	f.t.Helper()
	if err := f.e.SetGate(context.Background(), state, f.epoch); err != nil {
		f.t.Fatal(err)
	}
}
