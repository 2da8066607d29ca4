package testharness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// RepoRoot is the repository's top directory (where go.mod is).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// KubeAssets finds the kube-apiserver, etcd and kubectl binaries envtest runs:
// $KUBEBUILDER_ASSETS, or the cache hack/build-envtest.sh fills (it prints the
// directory; running it when the cache is warm takes well under a second).
func KubeAssets() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, checkAssets(dir)
	}
	script := filepath.Join(RepoRoot(), "hack", "build-envtest.sh")
	out, err := exec.Command("bash", script).Output()
	if err != nil {
		return "", fmt.Errorf("envtest binaries missing and %s failed: %w (run `make envtest`)", script, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dir := lines[len(lines)-1]
	return dir, checkAssets(dir)
}

func checkAssets(dir string) error {
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return fmt.Errorf("%s not found in %s: run `make envtest` (hack/build-envtest.sh builds it)", b, dir)
		}
	}
	return nil
}

// Kube is a real Kubernetes API server and etcd (envtest) with the project's CRDs
// installed.
type Kube struct {
	Env    *envtest.Environment
	Config *rest.Config

	dir      string     // wrappers, etcd's data and the API server's certificates
	usersMu  sync.Mutex // envtest's certificate authority is not safe for concurrent use
	stopOnce sync.Once
	stopErr  error
}

// kubeAttempts bounds StartKube's tries.
const kubeAttempts = 3

// StartKube starts the API server with the CRDs from config/crd/bases.
//
// envtest starts etcd and kube-apiserver without a parent-death signal, so a
// test binary killed before its cleanup (a -timeout, a SIGKILL) would leave
// them running. They are started through wrappers that set one (setpriv
// --pdeathsig KILL, then exec: the same PID envtest stops). Their files live
// in one directory, which Stop removes. CloseAll stops it if Stop was not called.
func StartKube() (*Kube, error) {
	assets, err := KubeAssets()
	if err != nil {
		return nil, err
	}
	// envtest picks etcd's and the API server's ports itself, from the
	// kernel's ephemeral range, and does not retry when another process takes
	// one first: the harness does, a few times.
	var errs []error
	for range kubeAttempts {
		dir, err := tempDir("kube")
		if err != nil {
			return nil, err
		}
		k, err := startKube(assets, dir)
		if err == nil {
			register(k)
			return k, nil
		}
		_ = os.RemoveAll(dir)
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func startKube(assets, dir string) (*Kube, error) {
	bin, certs := filepath.Join(dir, "bin"), filepath.Join(dir, "certs")
	for _, d := range []string{bin, certs} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, err
		}
	}
	etcd, err := pdeathsigWrapper(bin, filepath.Join(assets, "etcd"))
	if err != nil {
		return nil, err
	}
	apiserver, err := pdeathsigWrapper(bin, filepath.Join(assets, "kube-apiserver"))
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	env.ControlPlane.Etcd = &envtest.Etcd{Path: etcd, DataDir: filepath.Join(dir, "etcd")}
	env.ControlPlane.APIServer = &envtest.APIServer{Path: apiserver, CertDir: certs}
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop() // whatever did start
		return nil, fmt.Errorf("starting envtest: %w", err)
	}
	return &Kube{Env: env, Config: cfg, dir: dir}, nil
}

// pdeathsigWrapper writes into dir a script that runs bin so that it dies
// with its parent, and returns the script's path.
func pdeathsigWrapper(dir, bin string) (string, error) {
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		return "", fmt.Errorf("setpriv (Debian package util-linux, `make deps`) not found: %w", err)
	}
	path := filepath.Join(dir, filepath.Base(bin))
	script := fmt.Sprintf("#!/bin/sh\nexec %s --pdeathsig KILL %s \"$@\"\n", shellQuote(setpriv), shellQuote(bin))
	return path, os.WriteFile(path, []byte(script), 0o755)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// KubeT starts the API server for a test and stops it in t.Cleanup.
func KubeT(t testing.TB) *Kube {
	t.Helper()
	k, err := StartKube()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Stop() })
	return k
}

// Stop stops the API server and etcd. Calls after the first return its result.
func (k *Kube) Stop() error {
	k.stopOnce.Do(func() {
		unregister(k)
		k.stopErr = k.Env.Stop()
		if k.dir != "" {
			_ = os.RemoveAll(k.dir)
		}
	})
	return k.stopErr
}

// Close is Stop, for CloseAll.
func (k *Kube) Close() error { return k.Stop() }

// AddUser is envtest's AddUser, one call at a time: parallel tests add users
// to one API server, and envtest's certificate authority numbers its
// certificates without a lock.
func (k *Kube) AddUser(user envtest.User, base *rest.Config) (*envtest.AuthenticatedUser, error) {
	k.usersMu.Lock()
	defer k.usersMu.Unlock()
	return k.Env.AddUser(user, base)
}

// Kubeconfig writes a kubeconfig for the API server (for kubectl and processes)
// into dir and returns its path.
func (k *Kube) Kubeconfig(dir string) (string, error) {
	user, err := k.AddUser(envtest.User{Name: "flashsale-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", err
	}
	b, err := user.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "kubeconfig")
	return path, os.WriteFile(path, b, 0o600)
}
