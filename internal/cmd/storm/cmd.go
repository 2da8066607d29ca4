// Package storm is the `flashsale storm` command: a load generator that
// throws buyers at reserve endpoints and then audits the campaign's
// invariants in Redis and the ledger.
package storm

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/flashsale-dev/flashsale-operator/runtime/admission"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	"github.com/flashsale-dev/flashsale-operator/runtime/engine"
	"github.com/flashsale-dev/flashsale-operator/runtime/ledger"
	"github.com/flashsale-dev/flashsale-operator/runtime/storm"
)

// Options are the command's settings beyond storm.Config.
type Options struct {
	URLs      string
	KeyFile   string
	Audit     bool
	Settle    time.Duration
	JSON      bool
	AckedFile string
	Quiet     bool
	Seed      uint64

	Campaign config.Campaign
	Storm    storm.Config
}

// Progress pacing: a terminal redraws one line often; a log gets a line a second.
const (
	ttyEvery   = 200 * time.Millisecond
	plainEvery = time.Second
)

// auditTimeout bounds the audit's reads beyond the settle wait.
const auditTimeout = 30 * time.Second

// campaignFlagsHidden are config.Campaign flags the storm has no use for
// (the shard count is read from the ledger).
var campaignFlagsHidden = []string{"namespace", "name", "shards", "max-per-user", "steal-probes", "ttl", "grace-period"}

// NewCmd returns the `storm` command.
func NewCmd() *cobra.Command {
	o := Options{Audit: true}
	o.Storm = storm.Config{
		Buyers: 1000, Concurrency: storm.DefaultConcurrency, RetryRatio: 0.1, CheckoutRatio: 0.5, CancelRatio: 0.1,
		TokenTTL: storm.DefaultTokenTTL, Timeout: storm.DefaultTimeout, MaxAttempts: storm.DefaultMaxAttempts, Quantity: 1,
	}
	cmd := &cobra.Command{
		Use:   "storm",
		Short: "Storm reserve endpoints with buyers, then audit the campaign",
		Long: `Buyers with their own admission tokens reserve, retry with the same idempotency
key, check out, cancel or walk away, against one or more reserve URLs (spread
like a Service would; a failed attempt moves to the next URL).

The report gives outcomes by status and code, throughput and latency
percentiles, then the audit read from Redis and the ledger: available +
reserved + sold = allocation, nothing oversold, every acknowledged reservation
in the ledger. --settle waits for the sweeper to release what expired first.
The command exits non-zero when an invariant fails, when --settle was given
and the campaign did not settle in time, when a retry of an acknowledged
request did not replay it, when no request reached the sale (a wrong URL, SKU
or key), or when it was interrupted. Redirects are not followed.

The audit needs the campaign's Redis and PostgreSQL settings, as flags or the
same FLASHSALE_* variables as the reserve pods; --audit=false skips it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return run(cmd, &o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.URLs, "url", "http://127.0.0.1:8080", "reserve base URL; several comma-separated ones share the buyers")
	f.IntVar(&o.Storm.Buyers, "buyers", o.Storm.Buyers, "distinct buyers")
	f.IntVar(&o.Storm.Concurrency, "concurrency", o.Storm.Concurrency, "requests in flight at most")
	f.IntVar(&o.Storm.Count, "count", 0, "journeys (one reservation request each, then checkout/cancel); default --buyers unless --duration is set")
	f.DurationVar(&o.Storm.Duration, "duration", 0, "stop starting journeys after this long (with --count: whichever comes first)")
	f.Float64Var(&o.Storm.Rate, "rate", 0, "open loop: start journeys on a fixed schedule of this many per second, on at most --concurrency connections, and measure reserve latency from each one's due time (0: closed loop)")
	f.Float64Var(&o.Storm.RetryRatio, "retry-ratio", o.Storm.RetryRatio, "journeys that resend their reservation with the same idempotency key")
	f.Float64Var(&o.Storm.CheckoutRatio, "checkout-ratio", o.Storm.CheckoutRatio, "acknowledged reservations paid for")
	f.Float64Var(&o.Storm.CancelRatio, "cancel-ratio", o.Storm.CancelRatio, "acknowledged reservations cancelled by the buyer")
	f.Float64Var(&o.Storm.AbandonRatio, "abandon-ratio", 0, "acknowledged reservations never paid (default: the rest of 1; if set, the three must add up to 1)")
	f.Float64Var(&o.Storm.LoseRatio, "lose-ratio", 0, "acknowledged reservations whose answer the buyer loses with its idempotency key: it finds them in its list of reservations before paying, cancelling or walking away, and the storm checks the list")
	f.IntVar(&o.Storm.Quantity, "quantity", o.Storm.Quantity, "units per reservation")
	f.StringVar(&o.Storm.UserPrefix, "user-prefix", "", "user ids are <prefix>-<n> (default: a random prefix, so runs do not share buyers)")
	f.Uint64Var(&o.Seed, "seed", 0, "seed of the buyers' choices (default: random)")
	f.DurationVar(&o.Storm.TokenTTL, "token-ttl", o.Storm.TokenTTL, "lifetime of the admission tokens minted")
	f.DurationVar(&o.Storm.Timeout, "timeout", o.Storm.Timeout, "per-request timeout")
	f.IntVar(&o.Storm.MaxAttempts, "max-attempts", o.Storm.MaxAttempts, "attempts per request after transport errors, 503 and 429")
	f.StringVar(&o.KeyFile, "key-file", "", "file holding the admission key (default: "+config.EnvAdmissionKey+" or "+config.EnvAdmissionKey+config.FileSuffix+")")
	f.BoolVar(&o.Audit, "audit", o.Audit, "audit Redis and the ledger after the storm")
	f.DurationVar(&o.Settle, "settle", 0, "before the audit, wait up to this long for reserved units and pending orders to reach 0 (the sweeper releasing what expired)")
	f.BoolVar(&o.JSON, "json", false, "print the report as JSON")
	f.StringVar(&o.AckedFile, "acked-file", "", "write the acknowledged reservation ids here, one per line")
	f.BoolVar(&o.Quiet, "quiet", false, "no live progress")
	o.Campaign.AddFlags(f)
	for _, name := range campaignFlagsHidden {
		_ = f.MarkHidden(name)
	}
	return cmd
}

func run(cmd *cobra.Command, o *Options) error {
	ctx := cmd.Context()
	cfg := o.Storm
	cfg.URLs = splitList(o.URLs)
	cfg.SKU = o.Campaign.SKU
	if !cmd.Flags().Changed("abandon-ratio") {
		cfg.AbandonRatio = max(0, 1-cfg.CheckoutRatio-cfg.CancelRatio)
	}
	if cfg.UserPrefix == "" {
		cfg.UserPrefix = "storm-" + randomHex(3)
	}
	cfg.Seed = o.Seed
	if !cmd.Flags().Changed("seed") {
		cfg.Seed = randomSeed()
	}
	key, err := admissionKey(o.KeyFile)
	if err != nil {
		return err
	}
	cfg.Mint = func(sku, user string, ttl time.Duration, now time.Time) (string, error) {
		return admission.Mint(key, sku, user, ttl, now)
	}
	if err := validate(cfg, o.Settle); err != nil {
		return err
	}

	// The audit's connections are made first: a wrong DSN should fail before
	// the storm, not after it.
	var src storm.Source
	if o.Audit {
		audit, closeAll, err := openAudit(ctx, &o.Campaign, o.KeyFile)
		if err != nil {
			return fmt.Errorf("audit (use --audit=false to storm without it): %w", err)
		}
		defer closeAll()
		src = audit
	}

	stderr := cmd.ErrOrStderr()
	var progress *progressPrinter
	if !o.Quiet {
		progress = newProgressPrinter(stderr)
		cfg.Progress, cfg.ProgressEvery = progress.print, progress.every
	}
	res, err := storm.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if o.AckedFile != "" {
		if err := writeLines(o.AckedFile, res.Acked); err != nil {
			return fmt.Errorf("--acked-file: %w", err)
		}
	}

	var audit *storm.Audit
	if src != nil {
		settle := o.Settle
		if ctx.Err() != nil {
			settle = 0 // interrupted: audit once, without waiting
		}
		if settle > 0 && !o.Quiet {
			fmt.Fprintf(stderr, "waiting up to %s for the sweeper to settle the campaign...\n", settle)
		}
		// The reads outlive an interrupt (the audit of a partial run is still
		// worth having); the settle wait does not.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settle+auditTimeout)
		audit, err = storm.RunAuditUntil(actx, ctx.Done(), src, res, settle)
		cancel()
		if err != nil {
			return err
		}
	}
	rep := storm.NewReport(cfg, res, audit)
	out := cmd.OutOrStdout()
	if o.JSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = rep.WriteText(out)
	}
	if err != nil {
		return err
	}
	if !rep.OK {
		var fails []string
		if audit != nil {
			fails = audit.Failures
		}
		if n := len(res.IdempotencyViolations); n > 0 && audit == nil {
			fails = append(fails, fmt.Sprintf("%d idempotency violations", n))
		}
		if n := len(res.ListViolations); n > 0 && audit == nil {
			fails = append(fails, fmt.Sprintf("%d list violations", n))
		}
		fails = append(fails, rep.Failures...)
		return fmt.Errorf("storm failed: %s", strings.Join(fails, "; "))
	}
	return nil
}

func validate(cfg storm.Config, settle time.Duration) error {
	switch {
	case cfg.SKU == "":
		return fmt.Errorf("--sku (or %s) is required", config.EnvSKU)
	case cfg.Concurrency < 1:
		return fmt.Errorf("--concurrency must be at least 1, got %d", cfg.Concurrency)
	case cfg.Quantity < 1:
		return fmt.Errorf("--quantity must be at least 1, got %d", cfg.Quantity)
	case cfg.MaxAttempts < 1:
		return fmt.Errorf("--max-attempts must be at least 1, got %d", cfg.MaxAttempts)
	case cfg.Timeout <= 0:
		return fmt.Errorf("--timeout must be positive, got %s", cfg.Timeout)
	case cfg.TokenTTL <= 0:
		return fmt.Errorf("--token-ttl must be positive, got %s", cfg.TokenTTL)
	case settle < 0:
		return fmt.Errorf("--settle must not be negative, got %s", settle)
	}
	return cfg.Validate()
}

// admissionKey reads --key-file, or the key from the environment as the
// reserve pods get it.
func admissionKey(keyFile string) ([]byte, error) {
	var key string
	if keyFile != "" {
		b, err := os.ReadFile(keyFile)
		if err != nil {
			return nil, fmt.Errorf("--key-file: %w", err)
		}
		key = strings.TrimRight(string(b), "\r\n")
	} else {
		var err error
		if key, err = config.Secret(config.EnvAdmissionKey); err != nil {
			return nil, err
		}
	}
	if len(key) < admission.MinKeyLen {
		return nil, fmt.Errorf("an admission key of at least %d bytes is required: --key-file, %s or %s%s",
			admission.MinKeyLen, config.EnvAdmissionKey, config.EnvAdmissionKey, config.FileSuffix)
	}
	return []byte(key), nil
}

// openAudit connects to the campaign's Redis and ledger and builds an engine
// only to read counts (and the ledger for statuses); its shard count comes from the ledger, so a wrong
// --shards cannot skew the audit.
func openAudit(ctx context.Context, c *config.Campaign, keyFile string) (storm.EngineSource, func(), error) {
	if keyFile != "" {
		// Complete reads the key from the environment; hand it --key-file the way
		// the pods would get it, as the _FILE variable.
		_ = os.Unsetenv(config.EnvAdmissionKey)
		_ = os.Setenv(config.EnvAdmissionKey+config.FileSuffix, keyFile)
	}
	if err := c.Complete(); err != nil {
		return storm.EngineSource{}, nil, err
	}
	octx, cancel := context.WithTimeout(ctx, auditTimeout)
	defer cancel()
	l, err := ledger.Open(octx, c.PostgresDSN)
	if err != nil {
		return storm.EngineSource{}, nil, err
	}
	camp, err := l.GetCampaign(octx, c.ID)
	if err != nil {
		l.Close()
		return storm.EngineSource{}, nil, err
	}
	rdb := c.Redis.Client()
	if err := rdb.Ping(octx).Err(); err != nil {
		rdb.Close()
		l.Close()
		return storm.EngineSource{}, nil, fmt.Errorf("redis: %w", err)
	}
	ecfg := c.EngineConfig()
	ecfg.Shards = camp.Shards
	eng, err := engine.New(ecfg, rdb, l, ledger.MaterializerConfig{})
	if err != nil {
		rdb.Close()
		l.Close()
		return storm.EngineSource{}, nil, err
	}
	return storm.EngineSource{Engine: eng, Ledger: l}, func() { eng.Close(); rdb.Close(); l.Close() }, nil
}

func writeLines(path string, lines []string) error {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func randomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

// progressPrinter redraws one line on a terminal, or prints plain lines to a
// log or pipe.
type progressPrinter struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	every time.Duration
}

func newProgressPrinter(w io.Writer) *progressPrinter {
	p := &progressPrinter{w: w, every: plainEvery}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.tty, p.every = true, ttyEvery
	}
	return p
}

func (p *progressPrinter) print(pr storm.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	line := storm.FormatProgress(pr)
	switch {
	case p.tty && pr.Final:
		fmt.Fprintf(p.w, "\r\033[K%s\n", line)
	case p.tty:
		fmt.Fprintf(p.w, "\r\033[K%s", line)
	default:
		fmt.Fprintln(p.w, line)
	}
}
