package testharness

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// dockerStage is what the test reads of the Dockerfile's final stage.
type dockerStage struct {
	base       string
	user       string
	entrypoint []string
	copies     []string // destinations of COPY
}

// parseFinalStage reads the Dockerfile's last FROM stage (continuation lines
// joined; comments dropped).
func parseFinalStage(t *testing.T, path string) dockerStage {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		cur.WriteString(line)
		lines = append(lines, cur.String())
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	var st dockerStage
	for _, l := range lines {
		inst, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(inst) {
		case "FROM":
			st = dockerStage{base: strings.Fields(rest)[0]}
		case "USER":
			st.user = rest
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &st.entrypoint); err != nil {
				t.Fatalf("ENTRYPOINT %s is not in exec form: %v", rest, err)
			}
		case "COPY":
			f := strings.Fields(rest)
			st.copies = append(st.copies, f[len(f)-1])
		}
	}
	return st
}

// The image built without a daemon is the Dockerfile's final stage: same
// entrypoint, same user, the same files where the stage copies them, the
// nonroot account its base has, and no shell.
func TestOperatorImageAgreesWithTheDockerfile(t *testing.T) {
	st := parseFinalStage(t, filepath.Join(RepoRoot(), "Dockerfile"))
	if st.base != "gcr.io/distroless/static:nonroot" {
		t.Fatalf("the Dockerfile's final stage is FROM %s; OperatorImageSpec copies distroless/static:nonroot's account files, check them", st.base)
	}
	dir := t.TempDir()
	bin := []byte("#!binary stand-in: only its path and mode matter here\n")
	archive := filepath.Join(dir, "operator.oci.tar")
	if err := WriteImageArchive(OperatorImageSpec(bin), archive); err != nil {
		t.Fatal(err)
	}
	files, cfg := readArchive(t, archive, dir)
	if !slices.Equal(cfg.Entrypoint, st.entrypoint) {
		t.Errorf("image entrypoint %q, Dockerfile %q", cfg.Entrypoint, st.entrypoint)
	}
	if cfg.User != st.user {
		t.Errorf("image user %q, Dockerfile %q", cfg.User, st.user)
	}
	for _, c := range st.copies {
		if files[strings.TrimPrefix(c, "/")] != 0o755 {
			t.Errorf("the Dockerfile copies %s; the image has it with mode %o", c, files[strings.TrimPrefix(c, "/")])
		}
	}
	if len(st.copies) == 0 {
		t.Error("no COPY found in the Dockerfile's final stage")
	}
	for _, sh := range []string{"bin/sh", "bin/bash", "bin/busybox"} {
		if _, ok := files[sh]; ok {
			t.Errorf("the image has a shell: /%s", sh)
		}
	}
	uid, _, _ := strings.Cut(st.user, ":")
	passwd := string(nonrootFiles[0].Data)
	if !strings.Contains(passwd, ":x:"+uid+":") || files["etc/passwd"] == 0 {
		t.Errorf("the image's /etc/passwd has no account for uid %s", uid)
	}
}

// Names as the kubelet asks containerd for them.
func TestNormalizeImageName(t *testing.T) {
	for in, want := range map[string]string{
		"flashsale-operator:local":     "docker.io/library/flashsale-operator:local",
		"someone/app:1":                "docker.io/someone/app:1",
		"registry.k8s.io/pause:3.10.2": "registry.k8s.io/pause:3.10.2",
		"localhost/x:1":                "localhost/x:1",
	} {
		if got := NormalizeImageName(in); got != want {
			t.Errorf("NormalizeImageName(%q) = %q, want %q", in, got, want)
		}
	}
}

// Bad input: no name or no entrypoint is an error and writes nothing.
func TestWriteImageArchiveRejectsAnIncompleteSpec(t *testing.T) {
	out := filepath.Join(t.TempDir(), "x.tar")
	for _, spec := range []ImageSpec{{Entrypoint: []string{"/x"}}, {Name: "x:1"}, {Name: "x:1", Entrypoint: []string{"/x"}, Files: []ImageFile{{Path: "rel"}}}} {
		if err := WriteImageArchive(spec, out); err == nil {
			t.Errorf("WriteImageArchive(%+v) succeeded", spec)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("WriteImageArchive(%+v) left %s", spec, out)
		}
	}
}

type imageConfig struct {
	Entrypoint []string
	User       string
}

// readArchive unpacks the OCI archive, checks its one image is named for
// containerd, and returns its layer's files (path -> permission bits) and config.
func readArchive(t *testing.T, archive, dir string) (map[string]os.FileMode, imageConfig) {
	t.Helper()
	lay := filepath.Join(dir, "unpacked")
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(lay, h.Name)
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	idx, err := layout.ImageIndexFromPath(lay)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Annotations["io.containerd.image.name"] != "docker.io/library/"+OperatorImage {
		t.Fatalf("index %+v: want one image named docker.io/library/%s", im.Manifests, OperatorImage)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" {
		t.Errorf("image OS %q", cf.OS)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	files := map[string]os.FileMode{}
	lr := tar.NewReader(rc)
	for {
		h, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			files[h.Name] = os.FileMode(h.Mode).Perm()
		}
	}
	return files, imageConfig{Entrypoint: cf.Config.Entrypoint, User: cf.Config.User}
}
