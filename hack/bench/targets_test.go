package main

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/internal/cmd/reserve"
)

// --targets reserve-pipe expands to one target per --reserve-pipelines and
// --reserve-linger, each the product; a name that only looks like one is not.
func TestPipeTargetsPerLinger(t *testing.T) {
	o := &options{Targets: []string{targetReserve, targetReservePipe, targetBare}, ReservePipelines: []int{1, 4}, ReserveLingers: []time.Duration{0, 250 * time.Microsecond}}
	got := o.targets()
	want := []string{targetReserve, "reserve-pipe-0s", "reserve-pipe-250µs", "reserve-pipe-0s-x4", "reserve-pipe-250µs-x4", targetBare}
	if !slices.Equal(got, want) {
		t.Fatalf("targets() = %v, want %v", got, want)
	}
	for _, tc := range []struct {
		target  string
		linger  time.Duration
		pipe    bool
		reserve bool
	}{
		{"reserve-pipe-250µs", 250 * time.Microsecond, true, true},
		{"reserve-pipe-0s", 0, true, true},
		{"reserve-pipe-0s-x4", 0, true, true},
		{"reserve-pipe-0s-x0", 0, false, false},
		{"reserve-pipe-0s-xx", 0, false, false},
		{"reserve-pipe-soon", 0, false, false},
		{targetReservePipe, 0, false, false},
		{targetReserve, 0, false, true},
		{targetReserveB, 0, false, true},
		{targetReserveDirect, 0, false, true},
		{targetBare, 0, false, false},
	} {
		d, _, ok := pipeOf(tc.target)
		if d != tc.linger || ok != tc.pipe || isReserve(tc.target) != tc.reserve {
			t.Errorf("%s: pipeOf = %s, %v; isReserve %v; want %s, %v, %v", tc.target, d, ok, isReserve(tc.target), tc.linger, tc.pipe, tc.reserve)
		}
		if _, n, _ := pipeOf(tc.target); tc.pipe && n != max(1, strings.Count(tc.target, "-x")*4) {
			t.Errorf("%s: %d pipelines in flight", tc.target, n)
		}
	}
	// The open loop runs every variant of the product and the bare handler.
	if got := o.openLoopTargets(); !slices.Equal(got, want) {
		t.Errorf("openLoopTargets() = %v, want %v", got, want)
	}
}

// A variant of the product is held against the product round by round.
func TestVariantRatiosArePaired(t *testing.T) {
	row := func(target string, round int, rate, server float64) StormRow {
		return StormRow{Kind: kindReservations, Target: target, Concurrency: 64, Round: round, ReservationsPerSecond: rate, ServerCPUus: server}
	}
	r := &Report{Storms: []StormRow{
		row(targetReserve, 1, 1000, 100), row(targetReserveB, 1, 1100, 90),
		row(targetReserve, 2, 2000, 50), row(targetReserveB, 2, 1800, 60),
		row(targetReserve, 3, 3000, 40), row(targetReserveB, 3, 3300, 36),
	}}
	got := r.variantRatios(64, r.reservationRows(targetReserve, 64))
	if len(got) != 1 {
		t.Fatalf("variantRatios = %v, want one", got)
	}
	if want := 1800.0 / 2000 * 100; got[0].Value != want {
		t.Errorf("median ratio %v, want %v", got[0].Value, want)
	}
	if want := "paired 110.0%"; !strings.Contains(got[0].Detail, want) || !strings.Contains(got[0].Detail, "(paired 0.900)") {
		t.Errorf("detail %q lacks %q or the server CPU's paired 0.900", got[0].Detail, want)
	}
}

// The new flags refuse what they cannot run, with the flag named.
func TestValidateRefusesBadVariantsAndCommitRuns(t *testing.T) {
	good := func() *options {
		return &options{Duration: time.Second, SoldOutDuration: time.Second, HotRowDuration: time.Second,
			Concurrency: []int{64}, HotRowClients: []int{64}, MaxRequests: 1, HotRowMaxTx: 1, Shards: 1, Rounds: 1, OpenLoopRounds: 1,
			ReservePipeline: 32, ReservePipelines: []int{1}, ReserveLingers: []time.Duration{0}, Targets: []string{targetReserve},
			Commits: CommitOptions{Conns: 64, Duration: time.Second, MaxTx: 1}, ProfileStorm: kindReservations}
	}
	if err := good().validate(); err != nil {
		t.Fatalf("good options refused: %v", err)
	}
	overload := good()
	overload.Concurrency = []int{64, 1024, maxBuyers}
	if err := overload.validate(); err != nil {
		t.Fatalf("an overload storm refused: %v", err)
	}
	for name, tc := range map[string]struct {
		change func(*options)
		want   string
	}{
		"negative linger":       {func(o *options) { o.ReserveLingers = []time.Duration{0, -time.Microsecond} }, "--reserve-linger"},
		"no linger":             {func(o *options) { o.ReserveLingers = nil }, "--reserve-linger"},
		"no pipelines":          {func(o *options) { o.ReservePipelines = []int{1, 0} }, "--reserve-pipelines"},
		"reserve-b, no binary":  {func(o *options) { o.Targets = append(o.Targets, targetReserveB) }, "--flashsale-b"},
		"binary, no reserve-b":  {func(o *options) { o.FlashsaleB = "/bin/true" }, "--flashsale-b"},
		"no commit connections": {func(o *options) { o.Commits.Conns = 0 }, "--limits-commit-conns"},
		"too many connections":  {func(o *options) { o.Commits.Conns = 281 }, "--limits-commit-conns"},
		"too many buyers":       {func(o *options) { o.Concurrency = []int{64, maxBuyers + 1} }, "--concurrency 4097"},
		"no buyer":              {func(o *options) { o.Concurrency = []int{0} }, "--concurrency 0"},
		"too many hot-row":      {func(o *options) { o.HotRowClients = []int{281} }, "--hotrow-clients 281"},
		"negative limit rounds": {func(o *options) { o.Limits.Rounds = -1 }, "--limits-rounds"},
		"unknown skip":          {func(o *options) { o.Skip = []string{"commit"} }, `--skip "commit"`},
		"unknown profile storm": {func(o *options) { o.ProfileStorm = "soldout" }, `--profile-storm "soldout"`},
		"no open-loop rounds":   {func(o *options) { o.OpenLoopRounds = 0 }, "--open-loop-rounds"},
		"one schedule twice":    {func(o *options) { o.OpenLoop = []float64{0.5, 0.504} }, "--open-loop 0.5 and 0.504"},
	} {
		o := good()
		tc.change(o)
		err := o.validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: validate() = %v, want an error naming %s", name, err, tc.want)
		}
	}
}

// Each target's process gets its pipeline settings explicitly: the product's
// defaults, none for the -direct targets, a reserve-pipe target's own.
func TestPipelineEnvPerTarget(t *testing.T) {
	o := &options{ReservePipeline: 16}
	def := []string{"FLASHSALE_RESERVE_PIPELINE=" + strconv.Itoa(reserve.DefaultReservePipeline), "FLASHSALE_RESERVE_LINGER=0s",
		"FLASHSALE_RESERVE_PIPELINES=" + strconv.Itoa(reserve.DefaultReservePipelines)}
	alone := []string{"FLASHSALE_RESERVE_PIPELINE=0", "FLASHSALE_RESERVE_LINGER=0s", "FLASHSALE_RESERVE_PIPELINES=1"}
	for _, tc := range []struct {
		target string
		want   []string
	}{
		{targetReserve, def},
		{targetReserveB, def},
		{targetBare, def},
		{targetReserveDirect, alone},
		{targetBareDirect, alone},
		{pipeTarget(100*time.Microsecond, 4), []string{"FLASHSALE_RESERVE_PIPELINE=16", "FLASHSALE_RESERVE_LINGER=100µs", "FLASHSALE_RESERVE_PIPELINES=4"}},
	} {
		if got := o.pipelineEnv(tc.target); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.target, got, tc.want)
		}
	}
}
