package storm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale-dev/flashsale-operator/runtime/admission"
	"github.com/flashsale-dev/flashsale-operator/runtime/config"
)

const testKey = "0123456789abcdef-storm-test-key"

// reserveOnly answers every reservation with a new id, after checking the
// admission token the storm minted.
func reserveOnly(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if c, err := admission.Parse([]byte(testKey), tok, time.Now()); err != nil || c.SKU != "sku-x" || !strings.HasPrefix(c.Subject, "storm-") {
			w.WriteHeader(401)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/api/v1/flash-sale/reserve":
			w.WriteHeader(201)
			fmt.Fprintf(w, `{"reservation_id":"0.r%d","status":"reserved"}`, n.Add(1))
		default:
			w.WriteHeader(200)
			fmt.Fprint(w, `{"status":"confirmed"}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func TestStormCommandJSONAndAckedFile(t *testing.T) {
	srv, n := reserveOnly(t)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, []byte(testKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	acked := filepath.Join(dir, "acked")
	cmd := NewCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"--url", srv.URL, "--sku", "sku-x", "--key-file", keyFile, "--buyers", "50",
		"--concurrency", "4", "--retry-ratio", "0", "--audit=false", "--json", "--acked-file", acked, "--checkout-ratio", "1", "--cancel-ratio", "0"})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	var rep struct {
		OK       bool                        `json:"ok"`
		Acked    int                         `json:"acked"`
		Outcomes map[string]map[string]int64 `json:"outcomes"`
		Audit    any                         `json:"audit"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !rep.OK || rep.Acked != 50 || rep.Outcomes["reserve"]["201"] != 50 || rep.Outcomes["checkout"]["200"] != 50 || rep.Audit != nil {
		t.Fatalf("report %s", out.String())
	}
	b, err := os.ReadFile(acked)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Fields(string(b)); len(lines) != 50 || int64(len(lines)) != n.Load() {
		t.Fatalf("%d acked lines for %d reservations", len(lines), n.Load())
	}
	// Not a terminal: plain progress lines, the last one final.
	if !strings.Contains(errOut.String(), "journeys 50/50") || strings.Contains(errOut.String(), "\r") {
		t.Fatalf("progress output %q", errOut.String())
	}
}

func TestStormCommandRefusesBadSettings(t *testing.T) {
	srv, _ := reserveOnly(t)
	t.Setenv(config.EnvAdmissionKey, testKey)
	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
		want string
	}{
		"short key":        {[]string{"--sku", "s"}, map[string]string{config.EnvAdmissionKey: "short"}, "at least 16 bytes"},
		"no sku":           {nil, nil, "--sku"},
		"ratios over 1":    {[]string{"--sku", "s", "--abandon-ratio", "0.9"}, nil, "add up to 1"},
		"audit without db": {[]string{"--sku", "s"}, nil, "--audit=false"},
		"NaN ratio":        {[]string{"--sku", "s", "--checkout-ratio", "NaN"}, nil, "checkout ratio"},
		"no concurrency":   {[]string{"--sku", "s", "--concurrency", "0"}, nil, "--concurrency"},
		"negative qty":     {[]string{"--sku", "s", "--quantity", "-3"}, nil, "--quantity"},
		"no attempts":      {[]string{"--sku", "s", "--max-attempts", "-1"}, nil, "--max-attempts"},
		"negative timeout": {[]string{"--sku", "s", "--timeout", "-1s"}, nil, "--timeout"},
		"negative ttl":     {[]string{"--sku", "s", "--token-ttl", "-5m"}, nil, "--token-ttl"},
		"negative settle":  {[]string{"--sku", "s", "--settle", "-5s"}, nil, "--settle"},
	} {
		t.Run(name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			cmd := NewCmd()
			cmd.SetOut(&bytes.Buffer{})
			cmd.SetErr(&bytes.Buffer{})
			cmd.SetArgs(append([]string{"--url", srv.URL, "--quiet"}, tc.args...))
			err := cmd.Execute()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}
