package process_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/storm"
)

// The storm: 10,000 buyers on 1,000 units, with retries, checkouts,
// cancels and abandons.
const (
	buyers      = 10_000
	concurrency = 64
	// stormLimit bounds a storm in time as --count bounds it in requests.
	stormLimit = 90 * time.Second
	// settle covers the TTL, the grace period and a few sweeper intervals.
	settle = 30 * time.Second
)

// report is the part of `flashsale storm --json` the tests read.
type report struct {
	OK        bool                        `json:"ok"`
	Acked     int                         `json:"acked"`
	Confirmed int                         `json:"confirmed"`
	Cancelled int                         `json:"cancelled"`
	Abandoned int64                       `json:"abandoned"`
	Recovered int64                       `json:"recovered"`
	Outcomes  map[string]map[string]int64 `json:"outcomes"`
	Latency   map[string]struct {
		Count int64   `json:"count"`
		P99   float64 `json:"p99"`
	} `json:"latency_ms"`
	Audit *struct {
		Allocation    int64    `json:"allocation"`
		Available     int64    `json:"available"`
		Reserved      int64    `json:"reserved"`
		Sold          int64    `json:"sold"`
		Pending       int64    `json:"pending"`
		Oversold      int64    `json:"oversold"`
		Conserved     bool     `json:"conserved"`
		Settled       bool     `json:"settled"`
		AckedInLedger int      `json:"acked_in_ledger"`
		Failures      []string `json:"failures"`
		OK            bool     `json:"ok"`
	} `json:"audit"`
}

// stormRun is a `flashsale storm` process.
type stormRun struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdout bytes.Buffer
	acked  string
	log    string
	start  time.Time
	done   chan struct{}
}

// startStorm execs `flashsale storm` against urls, with the campaign's
// settings in its environment for the audit.
func (c *campaign) startStorm(urls []string, extra ...string) *stormRun {
	c.t.Helper()
	s := &stormRun{t: c.t, acked: filepath.Join(c.dir, "acked"), log: filepath.Join(c.dir, "storm.log"), done: make(chan struct{})}
	args := append([]string{"storm",
		"--url", strings.Join(urls, ","),
		"--buyers", strconv.Itoa(buyers), "--count", strconv.Itoa(buyers), "--concurrency", strconv.Itoa(concurrency), "--duration", stormLimit.String(),
		"--retry-ratio", "0.1", "--checkout-ratio", "0.4", "--cancel-ratio", "0.1", "--abandon-ratio", "0.5",
		"--settle", settle.String(), "--json", "--acked-file", s.acked,
		"--seed", strconv.FormatUint(c.seed, 10), "--user-prefix", "storm-" + strconv.FormatUint(c.seed, 36),
	}, extra...)
	ctx, cancel := context.WithTimeout(context.Background(), stormLimit+settle+time.Minute)
	c.t.Cleanup(cancel)
	s.cmd = exec.CommandContext(ctx, binary, args...)
	s.cmd.Env = c.env()
	s.cmd.Stdout = &s.stdout
	logf, err := os.Create(s.log)
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	s.cmd.Stderr = logf // progress lines: not a terminal, so plain ones
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	s.start = time.Now()
	if err := s.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	c.t.Cleanup(func() {
		<-s.done
		if c.t.Failed() || os.Getenv(envLogs) != "" {
			c.t.Logf("--- storm log (tail) ---\n%s\n--- storm report ---\n%s", tail(s.log, 20), s.stdout.String())
		}
	})
	return s
}

// wait returns the storm's report and acknowledged ids once it has exited.
func (s *stormRun) wait() (*report, []string, int) {
	s.t.Helper()
	<-s.done
	code := s.cmd.ProcessState.ExitCode()
	s.t.Logf("storm exited %d after %s", code, time.Since(s.start).Round(time.Millisecond))
	var r report
	if err := json.Unmarshal(s.stdout.Bytes(), &r); err != nil {
		s.t.Fatalf("storm report: %v\n%s\n%s", err, s.stdout.String(), tail(s.log, 20))
	}
	b, err := os.ReadFile(s.acked)
	if err != nil {
		s.t.Fatal(err)
	}
	return &r, strings.Fields(string(b)), code
}

// startReserve runs one `flashsale reserve` replica and waits until it is ready.
func (c *campaign) startReserve(name string) *process {
	p := c.start(name, c.env(), "reserve")
	p.waitReady(30 * time.Second)
	return p
}

func (p *process) url() string { return "http://" + p.addr }

// orders counts the campaign's ledger rows.
func (c *campaign) orders() int {
	c.t.Helper()
	var n int
	if err := c.l.Pool().QueryRow(context.Background(),
		`SELECT count(*) FROM flashsale_orders WHERE campaign_id = $1`, c.id).Scan(&n); err != nil {
		c.t.Fatal(err)
	}
	return n
}

// assertAckedInLedger checks I3 from the test's side, not only the storm's
// audit: every id the storm was acknowledged has a ledger row, and no
// sweeper took it for a reservation that was never written.
func (c *campaign) assertAckedInLedger(acked []string) {
	c.t.Helper()
	rows, err := c.l.Pool().Query(context.Background(),
		`SELECT reservation_id, status FROM flashsale_orders WHERE campaign_id = $1
		   AND request_key = ANY (ARRAY(SELECT split_part(id, '.', 2) FROM unnest($2::text[]) AS id)) AND reservation_id = ANY($2::text[])`, c.id, acked)
	if err != nil {
		c.t.Fatal(err)
	}
	got := map[string]ledger.Status{}
	for rows.Next() {
		var id, st string
		if err := rows.Scan(&id, &st); err != nil {
			c.t.Fatal(err)
		}
		got[id] = ledger.Status(st)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		c.t.Fatal(err)
	}
	var missing, abandoned int
	for _, id := range acked {
		switch s, ok := got[id]; {
		case !ok:
			missing++
		case s == ledger.StatusAbandoned:
			abandoned++
		}
	}
	if missing+abandoned > 0 {
		c.t.Fatalf("I3 violated: of %d acknowledged reservations, %d have no ledger row and %d were recorded ABANDONED", len(acked), missing, abandoned)
	}
}

// assertSettled checks the campaign from the test's side after the storm's
// settle: nothing reserved or pending, nothing oversold, every unit either
// sold or back in stock.
func (c *campaign) assertSettled() {
	c.t.Helper()
	n := c.counts()
	if n.Oversold() != 0 || n.Sold > allocation {
		c.t.Fatalf("I1 violated: %+v", n)
	}
	if n.Reserved != 0 || n.Pending != 0 {
		c.t.Fatalf("not settled: reserved %d, pending %d", n.Reserved, n.Pending)
	}
	if !n.Conserved() || n.Available+n.Sold != allocation {
		c.t.Fatalf("I2 violated: available %d + reserved %d + sold %d != %d", n.Available, n.Reserved, n.Sold, allocation)
	}
}

func assertReportOK(t *testing.T, r *report, code int) {
	t.Helper()
	if code != 0 || !r.OK || r.Audit == nil || !r.Audit.OK {
		t.Fatalf("storm exit %d, report ok %v, audit %+v", code, r.OK, r.Audit)
	}
	if a := r.Audit; a.Allocation != allocation || a.Oversold != 0 || !a.Conserved || !a.Settled ||
		a.Reserved != 0 || a.Pending != 0 || a.AckedInLedger != r.Acked {
		t.Fatalf("audit %+v", a)
	}
}

// finalAnswers splits a storm's outcomes of one kind into final answers and
// the attempts the storm retries (storm.Retried).
func finalAnswers(outcomes map[string]int64) (final, retried int64) {
	for code, n := range outcomes {
		if storm.Retried(code) {
			retried += n
		} else {
			final += n
		}
	}
	return final, retried
}

// The outcomes of a run on a stalled machine: one buyer's first attempt
// timed out (503) and its retry was answered.
func TestFinalAnswersSplitsRetriedAttempts(t *testing.T) {
	final, retried := finalAnswers(map[string]int64{"201": 1261, "410 SOLD_OUT": 8739, "503 UNAVAILABLE": 1, "429 RATE_LIMITED": 2, "ERR timeout": 3})
	if final != 10000 || retried != 6 {
		t.Fatalf("final %d, retried %d; want 10000 and 6", final, retried)
	}
}

// Two reserve and two sweeper processes, 10,000 buyers on 1,000 units: every
// acknowledged reservation in the ledger, the audit exact after the sweeper
// caught up, and each reservation ending once: paid, cancelled or released.
// A fifth of the buyers lose their answer and find their reservation in
// their list instead (the report fails if a list does not show it).
func TestStormTwoReplicas(t *testing.T) {
	c := newCampaign(t)
	r1, r2 := c.startReserve("reserve-1"), c.startReserve("reserve-2")
	s1, s2 := c.startSweeper("sweeper-1"), c.startSweeper("sweeper-2")

	r, acked, code := c.startStorm([]string{r1.url(), r2.url()}, "--lose-ratio", "0.2").wait()
	assertReportOK(t, r, code)
	// A list answered after its reservation lapsed and was released does
	// not show it (and is no violation).
	if lists := r.Outcomes["list"]["200"]; r.Recovered == 0 || r.Recovered > lists {
		t.Fatalf("%d lost answers found in %d lists answered: %v", r.Recovered, lists, r.Outcomes["list"])
	}
	t.Logf("%d of %d acknowledged reservations found again in their buyers' lists", r.Recovered, r.Acked)
	c.assertAckedInLedger(acked)
	c.assertSettled()

	// Every attempt is counted, and the storm retries a 503, a 429 or a
	// transport error (a stall of a busy machine can time a request out):
	// each buyer has one final answer, unless every attempt it made was one
	// of those.
	res := r.Outcomes["reserve"]
	if final, retried := finalAnswers(res); final > buyers || final+retried < buyers {
		t.Fatalf("%d final reserve answers and %d retried attempts for %d buyers: %v", final, retried, buyers, res)
	}
	if res["201"] < allocation/2 || res["410 SOLD_OUT"] == 0 {
		t.Fatalf("reserve outcomes %v", res)
	}
	if r.Outcomes["retry"]["200"] == 0 || r.Outcomes["checkout"]["200"] == 0 || r.Outcomes["cancel"]["200"] == 0 {
		t.Fatalf("outcomes %v: retries, checkouts and cancels must all have happened", r.Outcomes)
	}
	if len(acked) != r.Acked || r.Abandoned == 0 {
		t.Fatalf("acked file %d ids, report %d acked, %d abandoned", len(acked), r.Acked, r.Abandoned)
	}
	// Nothing crashed, so every checkout got its answer: sold = confirmed.
	if n := c.counts(); n.Sold != int64(r.Confirmed) {
		t.Fatalf("sold %d, confirmed checkouts %d", n.Sold, r.Confirmed)
	}
	// I6 across two sweepers: each reservation neither paid nor cancelled was
	// released exactly once, by whichever sweeper led.
	released := metric(t, s1, metricReleased) + metric(t, s2, metricReleased)
	if want := r.Acked - r.Confirmed - r.Cancelled; int(released) != want {
		t.Fatalf("sweepers released %v reservations, want %d (acked %d - confirmed %d - cancelled %d)",
			released, want, r.Acked, r.Confirmed, r.Cancelled)
	}
}

// waitOrders waits until the storm has put n rows in the ledger: the storm
// is under way.
func (c *campaign) waitOrders(n int, s *stormRun) {
	c.t.Helper()
	testharness.Eventually(c.t, 60*time.Second, "the storm to get going", func() bool {
		select {
		case <-s.done:
			c.t.Fatal("the storm ended before the fault was injected")
		default:
		}
		return c.orders() >= n
	})
}

// A reserve replica SIGKILLed mid-storm: what it acknowledged is in the
// ledger; what it took without acknowledging comes back after expiry.
func TestStormReserveKilled(t *testing.T) {
	c := newCampaign(t)
	r1, r2 := c.startReserve("reserve-1"), c.startReserve("reserve-2")
	s1, s2 := c.startSweeper("sweeper-1"), c.startSweeper("sweeper-2")

	s := c.startStorm([]string{r1.url(), r2.url()})
	c.waitOrders(allocation/4, s)
	r1.kill()
	r, acked, code := s.wait()
	assertReportOK(t, r, code)
	c.assertAckedInLedger(acked)
	// Settled and exact: the units the dead replica took in Redis without a
	// ledger row (if the kill caught any) were recorded abandoned and released.
	c.assertSettled()
	if r.Outcomes["reserve"]["ERR refused"] == 0 {
		t.Fatalf("no request met the dead replica: %v", r.Outcomes["reserve"])
	}
	const abandoned = `flashsale_sweeper_reservations_total{outcome="abandoned"}`
	t.Logf("reservations without a ledger row released by the sweepers: %v", metric(t, s1, abandoned)+metric(t, s2, abandoned))
}

// A reserve replica terminated mid-storm drains: it exits 0 and nothing it
// acknowledged is lost.
func TestStormReserveTerminated(t *testing.T) {
	c := newCampaign(t)
	r1, r2 := c.startReserve("reserve-1"), c.startReserve("reserve-2")
	c.startSweeper("sweeper-1")
	c.startSweeper("sweeper-2")

	s := c.startStorm([]string{r1.url(), r2.url()})
	c.waitOrders(allocation/4, s)
	if code := r1.terminate(45 * time.Second); code != 0 {
		t.Fatalf("reserve exited %d after SIGTERM, want 0", code)
	}
	r, acked, code := s.wait()
	assertReportOK(t, r, code)
	c.assertAckedInLedger(acked)
	c.assertSettled()
}
