package controllers

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"maps"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	flashsalev1alpha1 "github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
	"github.com/flashsale-dev/flashsale-operator/internal/cmd/reserve"
	"github.com/flashsale-dev/flashsale-operator/internal/cmd/sweeper"
	"github.com/flashsale-dev/flashsale-operator/runtime/api"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
	runtimesweeper "github.com/flashsale-dev/flashsale-operator/runtime/sweeper"
)

// podCommand is the flag set of a command the child Deployments run, as the
// command itself builds it from the environment (its defaults come from
// there), and the campaign it completes.
type podCommand struct {
	flags   func() (*pflag.FlagSet, *config.Campaign, func() error)
	listen  string // the flag that holds EnvListen's address
	metrics string // the flag that holds EnvMetricsListen's, if any
	// probePort names the container port the command answers its probes on.
	probePort string
	probeMux  func() http.Handler
	// readyTimeout bounds the command's own readiness check: it must answer
	// before the kubelet's probe gives up.
	readyTimeout time.Duration
}

// podOptions are a command's settings: flags with environment defaults,
// checked (and the secrets read) by Complete.
type podOptions interface {
	AddFlags(*pflag.FlagSet)
	Complete() error
}

func commandFlags(name string, o podOptions, camp *config.Campaign) (*pflag.FlagSet, *config.Campaign, func() error) {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	o.AddFlags(fs)
	return fs, camp, o.Complete
}

var podCommands = map[string]podCommand{
	"reserve": {
		flags: func() (*pflag.FlagSet, *config.Campaign, func() error) {
			o := &reserve.Options{}
			return commandFlags("reserve", o, &o.Campaign)
		},
		listen: "listen", metrics: "metrics-listen", readyTimeout: api.ReadyTimeout,
		probePort: config.PortNameMetrics, // served by api.Server.MetricsHandler
	},
	"sweeper": {
		flags: func() (*pflag.FlagSet, *config.Campaign, func() error) {
			o := &sweeper.Options{}
			return commandFlags("sweeper", o, &o.Campaign)
		},
		listen: "listen", readyTimeout: runtimesweeper.ProbeTimeout, probePort: config.PortNameHTTP,
		probeMux: func() http.Handler {
			return runtimesweeper.Handler(prometheus.NewRegistry(), func() error { return nil }, func(context.Context) error { return nil })
		},
	},
}

// secretReads are the variables the commands read without a flag (secrets,
// read by config.Campaign.Complete), each with what it must have become.
var secretReads = map[string]func(c *config.Campaign, v string) bool{
	config.EnvRedisPassword: func(c *config.Campaign, v string) bool { return c.Redis.Password == v },
	config.EnvPostgresDSN:   func(c *config.Campaign, v string) bool { return c.PostgresDSN == v },
	config.EnvAdmissionKey:  func(c *config.Campaign, v string) bool { return string(c.AdmissionKey) == v },
	config.EnvAdmissionKeyPrevious: func(c *config.Campaign, v string) bool {
		return string(c.AdmissionKeyPrevious) == v
	},
	config.EnvIDKey:    func(c *config.Campaign, v string) bool { return base64.RawURLEncoding.EncodeToString(c.IDKey) == v },
	config.EnvRedisTLS: func(c *config.Campaign, v string) bool { return c.Redis.TLS != nil && v == "true" },
	config.EnvRedisTLSServerName: func(c *config.Campaign, v string) bool {
		return c.Redis.TLS != nil && c.Redis.TLS.ServerName == v
	},
	config.EnvRedisTLSCA: func(c *config.Campaign, v string) bool {
		want := x509.NewCertPool()
		return c.Redis.TLS != nil && want.AppendCertsFromPEM([]byte(v)) && c.Redis.TLS.RootCAs.Equal(want)
	},
	config.EnvRedisTLSCert: func(c *config.Campaign, v string) bool {
		b, _ := pem.Decode([]byte(v))
		return c.Redis.TLS != nil && len(c.Redis.TLS.Certificates) == 1 && b != nil &&
			string(c.Redis.TLS.Certificates[0].Certificate[0]) == string(b.Bytes)
	},
	config.EnvRedisTLSKey: func(c *config.Campaign, _ string) bool {
		return c.Redis.TLS != nil && len(c.Redis.TLS.Certificates) == 1 && c.Redis.TLS.Certificates[0].PrivateKey != nil
	},
}

var envInUsage = regexp.MustCompile(`\(env ([A-Z0-9_]+)\)`)

// flagReading is the flag whose usage names env as its default's source.
func flagReading(fs *pflag.FlagSet, env string) *pflag.Flag {
	var out *pflag.Flag
	fs.VisitAll(func(f *pflag.Flag) {
		if m := envInUsage.FindStringSubmatch(f.Usage); m != nil && m[1] == env {
			out = f
		}
	})
	return out
}

// other is a valid value of a flag's type different from v.
func other(t *testing.T, f *pflag.Flag, v string) string {
	t.Helper()
	switch f.Value.Type() {
	case "uint64":
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("--%s: %v", f.Name, err)
		}
		return strconv.FormatUint(n+1, 10)
	case "int", "int64":
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("--%s: %v", f.Name, err)
		}
		return strconv.FormatInt(n+1, 10)
	case "float64":
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatalf("--%s: %v", f.Name, err)
		}
		return strconv.FormatFloat(x+1, 'g', -1, 64)
	case "duration":
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("--%s: %v", f.Name, err)
		}
		return (d + time.Second).String()
	case "string":
		return v + "9"
	}
	t.Fatalf("--%s: no other value for a %s flag", f.Name, f.Value.Type())
	return ""
}

// setPodEnv makes env the process's whole FLASHSALE_* environment.
func setPodEnv(t *testing.T, env map[string]string) {
	t.Helper()
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "FLASHSALE_") {
			t.Setenv(name, "")
			_ = os.Unsetenv(name)
		}
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
}

// resolveEnv is the environment a kubelet gives container c, with secrets
// (Secret name → key → value) for the variables taken from Secrets.
func resolveEnv(t *testing.T, c corev1.Container, secrets map[string]map[string]string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			out[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			v, ok := secrets[ref.Name][ref.Key]
			if !ok {
				t.Fatalf("%s: the test's Secret %s has no key %q", e.Name, ref.Name, ref.Key)
			}
			out[e.Name] = v
		case e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
			// The limit in bytes (divisor 1), or without one the node's
			// allocatable memory.
			if d := e.ValueFrom.ResourceFieldRef.Divisor; d.Cmp(resource.MustParse("1")) != 0 {
				t.Fatalf("%s: divisor %s, want 1 (bytes)", e.Name, d.String())
			}
			q := resource.MustParse("8Gi")
			if l, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
				q = l
			}
			out[e.Name] = strconv.FormatInt(q.Value(), 10)
		default:
			t.Fatalf("%s: unexpected source %+v", e.Name, e.ValueFrom)
		}
	}
	return out
}

func portOf(t *testing.T, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(p)
	if err != nil || perr != nil {
		t.Fatalf("listen address %q has no port", addr)
	}
	return int32(n)
}

// The pod contract: the reserve and sweeper Deployments the controller
// renders are parsed with the commands' own flag sets. Every variable a
// Deployment sets is read by its command (a flag whose value it becomes and
// follows, or a secret Complete reads), the command accepts the whole
// environment, it listens on the container ports the probes and the Service
// name, and the sweeper serves the probes' paths. A variable renamed on one
// side only fails here.
func TestPodContract(t *testing.T) {
	fs := testSale(func(fs *flashsalev1alpha1.FlashSale) {
		// Values other than the commands' defaults, so that a variable
		// the command does not read shows.
		fs.Spec.Shards = ptr.To[int32](7)
		fs.Spec.MaxPerUser = ptr.To[int32](3)
		fs.Spec.Redis.Mode = flashsalev1alpha1.RedisModeCluster
		fs.Spec.Reservation = flashsalev1alpha1.ReservationSpec{
			TTL: &metav1.Duration{Duration: 90 * time.Second}, GracePeriod: &metav1.Duration{Duration: 7 * time.Second},
			StealProbes: ptr.To[int32](1), Replicas: ptr.To[int32](3),
			RequestTimeout: &metav1.Duration{Duration: 1500 * time.Millisecond}, MaxInFlight: ptr.To[int32](4096),
		}
		fs.Spec.Sweeper.Interval = &metav1.Duration{Duration: 5 * time.Second}
	})
	certPEM, keyPEM := selfSignedPEM(t)
	secrets := map[string]map[string]string{
		fs.Spec.Redis.SecretRef.Name: {
			SecretKeyRedisAddresses: "redis-0.shop:6379,redis-1.shop:6379", SecretKeyRedisUsername: "shop",
			SecretKeyRedisPassword: "redis-secret", SecretKeyRedisTLS: "true", SecretKeyRedisTLSCA: certPEM,
			SecretKeyRedisTLSCert: certPEM, SecretKeyRedisTLSKey: keyPEM, SecretKeyRedisTLSServerName: "redis.shop",
		},
		fs.Spec.Postgres.SecretRef.Name: {flashsalev1alpha1.DefaultPostgresSecretKey: "postgres://ledger@db.shop/flashsale"},
		fs.Spec.Admission.SecretRef.Name: {
			fs.Spec.Admission.SecretRef.Key:                           "0123456789abcdef-admission",
			fs.Spec.Admission.SecretRef.Key + AdmissionPreviousSuffix: "0123456789abcdef-previous",
		},
		ChildName(fs, ComponentIDs): {SecretKeyIDKey: base64.RawURLEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))},
	}
	for _, d := range []*struct {
		name string
		c    corev1.Container
	}{
		{"reserve", ReserveDeployment(fs, "flashsale:test").Spec.Template.Spec.Containers[0]},
		{"sweeper", SweeperDeployment(fs, "flashsale:test").Spec.Template.Spec.Containers[0]},
	} {
		t.Run(d.name, func(t *testing.T) {
			cmd, ok := podCommands[d.c.Args[0]]
			if !ok {
				t.Fatalf("the %s Deployment runs %v, no command of the pod contract", d.name, d.c.Args)
			}
			env := resolveEnv(t, d.c, secrets)
			setPodEnv(t, env)
			flags, camp, complete := cmd.flags()
			if err := flags.Parse(nil); err != nil {
				t.Fatal(err)
			}
			if err := complete(); err != nil {
				t.Fatalf("the %s command refuses the Deployment's environment: %v", d.c.Args[0], err)
			}
			for name, v := range env {
				if f := flagReading(flags, name); f != nil {
					if f.Value.String() != v {
						t.Errorf("%s=%q: --%s is %q", name, v, f.Name, f.Value.String())
					}
					// The flag follows the variable: it is read, not only named.
					changed := maps.Clone(env)
					changed[name] = other(t, f, v)
					setPodEnv(t, changed)
					again, _, _ := cmd.flags()
					if got := again.Lookup(f.Name).Value.String(); got != changed[name] {
						t.Errorf("%s=%q: --%s stays %q: the command does not read %s", name, changed[name], f.Name, got, name)
					}
					setPodEnv(t, env)
					continue
				}
				if read, ok := secretReads[name]; ok {
					if !read(camp, v) {
						t.Errorf("%s: the %s command did not take the Deployment's value", name, d.c.Args[0])
					}
					continue
				}
				t.Errorf("the %s Deployment sets %s, which the %s command does not read", d.name, name, d.c.Args[0])
			}

			ports := map[string]int32{}
			for _, p := range d.c.Ports {
				ports[p.Name] = p.ContainerPort
			}
			if got := portOf(t, flags.Lookup(cmd.listen).Value.String()); got != ports[config.PortNameHTTP] || got == 0 {
				t.Errorf("the %s command listens on port %d, the container's %q port is %d", d.c.Args[0], got, config.PortNameHTTP, ports[config.PortNameHTTP])
			}
			if cmd.metrics != "" {
				if got := portOf(t, flags.Lookup(cmd.metrics).Value.String()); got != ports[config.PortNameMetrics] || got == 0 {
					t.Errorf("--%s is port %d, the container's %q port is %d", cmd.metrics, got, config.PortNameMetrics, ports[config.PortNameMetrics])
				}
			}
			// The kubelet must not kill a process still opening the ledger,
			// which it may do for config.StartupTimeout before it listens.
			if sp := d.c.StartupProbe; sp == nil ||
				time.Duration(sp.PeriodSeconds*sp.FailureThreshold)*time.Second <= config.StartupTimeout {
				t.Errorf("the %s Deployment's startup probe %+v gives the process less than its %s to open the ledger", d.name, sp, config.StartupTimeout)
			}
			if rp := d.c.ReadinessProbe; rp == nil || cmd.readyTimeout >= time.Duration(rp.TimeoutSeconds)*time.Second {
				t.Errorf("the %s command's readiness check may take %s, its probe gives up after %+v", d.c.Args[0], cmd.readyTimeout, rp)
			}
			for _, p := range []*corev1.Probe{d.c.StartupProbe, d.c.LivenessProbe, d.c.ReadinessProbe} {
				if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.StrVal != cmd.probePort || ports[cmd.probePort] == 0 {
					t.Fatalf("a probe off the %q port the %s command serves its probes on: %+v", cmd.probePort, d.c.Args[0], p)
				}
				if cmd.probeMux != nil {
					rec := httptest.NewRecorder()
					cmd.probeMux().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p.HTTPGet.Path, nil))
					if rec.Code != http.StatusOK {
						t.Errorf("probe %s answers %d", p.HTTPGet.Path, rec.Code)
					}
				}
			}
		})
	}
	svc := ReserveService(fs)
	if target := svc.Spec.Ports[0].TargetPort.StrVal; target != config.PortNameHTTP {
		t.Errorf("the reserve Service targets port %q, the reserve pods listen on %q", target, config.PortNameHTTP)
	}
}

// selfSignedPEM is a self-signed certificate and its key, in PEM: the Redis
// TLS CA and client pair of the test's Secret.
func selfSignedPEM(t *testing.T) (certPEM, keyPEM string) {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), DNSNames: []string{"redis.shop"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}))
}

// A sale that leaves requestTimeout and maxInFlight out runs its reserve pods
// with the reserve process's own defaults, which a pod started by hand gets.
func TestSaleDefaultsAreTheReserveProcessDefaults(t *testing.T) {
	d, err := time.ParseDuration(flashsalev1alpha1.DefaultRequestTimeout)
	if err != nil || d != api.DefaultRequestTimeout || int(flashsalev1alpha1.DefaultMaxInFlight) != api.DefaultMaxInFlight {
		t.Fatalf("the CRD's defaults %s and %d, the reserve process's %s and %d",
			flashsalev1alpha1.DefaultRequestTimeout, flashsalev1alpha1.DefaultMaxInFlight, api.DefaultRequestTimeout, api.DefaultMaxInFlight)
	}
}
