package testharness

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/flashsale-dev/flashsale-operator/internal/cpustat"
)

// A test binary killed before its cleanup takes its API server and etcd with it.
func TestKubeDiesWithItsParent(t *testing.T) {
	helper := exec.Command(os.Args[0], "-test.run=^TestHelperKube$")
	helper.Env = append(os.Environ(), "TESTHARNESS_KUBE_HELPER=1")
	helper.Stderr = os.Stderr
	// The helper goes with this test binary, and its control plane with it.
	helper.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = helper.Process.Kill(); _ = helper.Wait() }()

	// The helper prints its control plane's PIDs and directory once it is up.
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var pids []int
	var dir, certs string
	for dir == "" || certs == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the helper exited before starting the API server")
			}
			if v, ok := strings.CutPrefix(l, "pid "); ok {
				pid, _ := strconv.Atoi(v)
				pids = append(pids, pid)
			}
			if v, ok := strings.CutPrefix(l, "dir "); ok {
				dir = v
			}
			if v, ok := strings.CutPrefix(l, "certs "); ok {
				certs = v
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("the helper did not start the API server in time")
		}
	}
	defer os.RemoveAll(dir)
	// envtest's own directory (webhook serving certificates), which a killed
	// process leaves behind.
	defer os.RemoveAll(certs)
	names := map[string]bool{}
	for _, pid := range pids {
		names[command(pid)] = true
	}
	if !names["etcd"] || !names["kube-apiserver"] {
		t.Fatalf("the helper's children %v are %v, want etcd and kube-apiserver", pids, names)
	}

	if err := helper.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = helper.Wait()
	deadline := time.Now().Add(15 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("%s (pid %d) outlived its killed parent", command(pid), pid)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func TestHelperKube(t *testing.T) {
	if os.Getenv("TESTHARNESS_KUBE_HELPER") == "" {
		t.Skip("helper process")
	}
	k, err := StartKube()
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range cpustat.Children(os.Getpid()) {
		fmt.Printf("pid %d\n", pid)
	}
	fmt.Printf("certs %s\n", k.Env.WebhookInstallOptions.LocalServingCertDir)
	fmt.Printf("dir %s\n", k.dir)
	time.Sleep(5 * time.Minute) // until killed
}

// command is the name of pid's executable ("" once it is gone).
func command(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// alive reports whether pid runs; a zombie that nobody reaped has died.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || !strings.HasPrefix(s[i+1:], " Z") && !strings.HasPrefix(s[i+1:], " X")
}

// Parallel tests write kubeconfigs for one API server at once: each gets its
// own working credentials, and -race sees no unsynchronised certificate.
func TestKubeconfigsWrittenAtOnce(t *testing.T) {
	k := KubeT(t)
	const n = 8
	paths := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		dir := t.TempDir()
		wg.Add(1)
		go func() {
			defer wg.Done()
			paths[i], errs[i] = k.Kubeconfig(dir)
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("kubeconfig %d: %v", i, errs[i])
		}
		cfg, err := clientcmd.BuildConfigFromFlags("", paths[i])
		if err != nil {
			t.Fatalf("kubeconfig %d: %v", i, err)
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.Discovery().ServerVersion(); err != nil {
			t.Errorf("kubeconfig %d does not reach the API server: %v", i, err)
		}
	}
}
