// Command fakepod stands in for the flashsale binary in the pod runner's
// tests: an HTTP server on $FLASHSALE_LISTEN that tells what it was started
// with and can be made unready or made to exit, and one answering the probes
// on $FLASHSALE_METRICS_LISTEN when that is set.
package main

import (
	"encoding/json"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	start := time.Now()
	readyAfter, _ := time.ParseDuration(os.Getenv("FAKEPOD_READY_AFTER"))
	var unready atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("GET /env", func(w http.ResponseWriter, _ *http.Request) {
		env := map[string]string{}
		for _, kv := range os.Environ() {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		wd, _ := os.Getwd()
		_ = json.NewEncoder(w).Encode(map[string]any{"args": os.Args[1:], "env": env, "pid": os.Getpid(), "wd": wd})
	})
	mux.HandleFunc("GET /whoami", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(os.Getenv("HOSTNAME") + " " + strconv.Itoa(os.Getpid())))
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if unready.Load() || time.Since(start) < readyAfter || os.Getenv("FAKEPOD_API_UNREADY") == "1" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("POST /unready", func(w http.ResponseWriter, _ *http.Request) { unready.Store(true) })
	mux.HandleFunc("POST /exit", func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.URL.Query().Get("code"))
		os.Exit(code)
	})

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	go func() {
		<-sig
		if os.Getenv("FAKEPOD_IGNORE_TERM") == "1" {
			return // only SIGKILL ends it now
		}
		os.Exit(0)
	}()
	if addr := os.Getenv("FLASHSALE_METRICS_LISTEN"); addr != "" {
		aside := http.NewServeMux()
		aside.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {})
		aside.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {})
		go func() {
			err := (&http.Server{Addr: addr, Handler: aside, ReadHeaderTimeout: 5 * time.Second}).ListenAndServe()
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(2)
		}()
	}
	srv := &http.Server{Addr: os.Getenv("FLASHSALE_LISTEN"), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	if err := srv.ListenAndServe(); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(2)
	}
}
