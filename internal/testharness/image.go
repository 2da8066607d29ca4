package testharness

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The operator image's shape: the Dockerfile's final stage (one static
// binary on distroless/static:nonroot, as user 65532). image_test.go parses
// the Dockerfile and checks that these agree with it.
const (
	OperatorBinaryPath = "/flashsale"
	OperatorUser       = "65532:65532"
	// OperatorImage is the name the operator's pod specs use in the tests;
	// containerd knows it by its normalised name.
	OperatorImage = "flashsale-operator:local"
	// PauseImage is the pod sandbox image of the test node's containerd.
	PauseImage = "registry.k8s.io/pause:3.10.2"
)

// OperatorEntrypoint is the Dockerfile's ENTRYPOINT.
var OperatorEntrypoint = []string{OperatorBinaryPath}

// ImageFile is one regular file of an image.
type ImageFile struct {
	Path string // absolute, in the image
	Mode fs.FileMode
	Data []byte
}

// ImageSpec is a single-layer image built without a container daemon.
type ImageSpec struct {
	Name       string // e.g. flashsale-operator:local
	Entrypoint []string
	User       string
	Env        []string
	Dirs       map[string]fs.FileMode // directories, besides the files' parents
	Files      []ImageFile
}

// NormalizeImageName is the name containerd and the kubelet use for a short
// image reference: docker.io/library/NAME for a bare name.
func NormalizeImageName(name string) string {
	first, _, found := strings.Cut(name, "/")
	if !found {
		return "docker.io/library/" + name
	}
	if !strings.ContainsAny(first, ".:") && first != "localhost" {
		return "docker.io/" + name
	}
	return name
}

// WriteImageArchive writes spec as an OCI image layout packed in a tar file at
// out, named for `ctr images import` (io.containerd.image.name).
func WriteImageArchive(spec ImageSpec, out string) error {
	img, err := buildImage(spec)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp(filepath.Dir(out), ".oci-layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	name := NormalizeImageName(spec.Name)
	_, tag, _ := strings.Cut(name[strings.LastIndex(name, "/")+1:], ":")
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          name,
		"org.opencontainers.image.ref.name": tag,
	})); err != nil {
		return err
	}
	return tarDir(dir, out)
}

func buildImage(spec ImageSpec) (v1.Image, error) {
	if spec.Name == "" || len(spec.Entrypoint) == 0 {
		return nil, errors.New("image: a name and an entrypoint are required")
	}
	layerTar, err := layerTar(spec)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.User = spec.User
	cf.Config.Env = spec.Env
	cf.Config.WorkingDir = "/"
	return mutate.ConfigFile(img, cf)
}

// layerTar is the layer's files: every directory (parents first), then the
// files, owned by root with fixed times so that the digest depends only on
// the content.
func layerTar(spec ImageSpec) ([]byte, error) {
	dirs := map[string]fs.FileMode{}
	for d, m := range spec.Dirs {
		dirs[strings.Trim(d, "/")] = m
	}
	for _, f := range spec.Files {
		if !strings.HasPrefix(f.Path, "/") {
			return nil, fmt.Errorf("image file %q: the path must be absolute", f.Path)
		}
		for d := filepath.Dir(strings.Trim(f.Path, "/")); d != "."; d = filepath.Dir(d) {
			if _, ok := dirs[d]; !ok {
				dirs[d] = 0o755
			}
		}
	}
	names := make([]string, 0, len(dirs))
	for d := range dirs {
		for p := filepath.Dir(d); p != "."; p = filepath.Dir(p) {
			if _, ok := dirs[p]; !ok {
				dirs[p] = 0o755
				names = append(names, p)
			}
		}
		names = append(names, d)
	}
	sort.Strings(names)
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	mtime := time.Unix(0, 0)
	for _, d := range names {
		mode := int64(dirs[d].Perm())
		if dirs[d]&fs.ModeSticky != 0 {
			mode |= 0o1000
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode, ModTime: mtime}); err != nil {
			return nil, err
		}
	}
	for _, f := range spec.Files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.Path, "/"), Mode: int64(f.Mode.Perm()), Size: int64(len(f.Data)), ModTime: mtime}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// tarDir packs dir's files (paths relative to dir) into out.
func tarDir(dir, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		src, err := os.Open(path)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	return errors.Join(err, tw.Close(), f.Close())
}

// nonrootFiles are the account files distroless/static:nonroot has: the
// user 65532 is "nonroot" with home /home/nonroot.
var nonrootFiles = []ImageFile{
	{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
	{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
}

// OperatorImageSpec is the operator image around a static flashsale binary.
func OperatorImageSpec(binary []byte) ImageSpec {
	return ImageSpec{
		Name:       OperatorImage,
		Entrypoint: OperatorEntrypoint,
		User:       OperatorUser,
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Dirs:       map[string]fs.FileMode{"tmp": 0o777 | fs.ModeSticky, "home/nonroot": 0o700},
		Files:      append(append([]ImageFile(nil), nonrootFiles...), ImageFile{Path: OperatorBinaryPath, Mode: 0o755, Data: binary}),
	}
}

// PauseImageSpec is the pod sandbox image around the pause program.
func PauseImageSpec(binary []byte) ImageSpec {
	return ImageSpec{Name: PauseImage, Entrypoint: []string{"/pause"}, User: "65535:65535",
		Files: []ImageFile{{Path: "/pause", Mode: 0o755, Data: binary}}}
}

// BuildStatic builds pkg (a main package of this module) as a static binary
// at out, as the Dockerfile's builder stage does.
func BuildStatic(pkg, out string, ldflags string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w "+ldflags, "-o", out, pkg)
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// BuildImages builds the flashsale binary and the pause program into dir and
// writes the operator and pause image archives there; it returns their paths.
func BuildImages(dir string) (operator, pause string, err error) {
	for _, b := range []struct{ pkg, bin, archive string }{
		{"./cmd/flashsale", "flashsale", "operator.oci.tar"},
		{"./internal/testharness/pause", "pause", "pause.oci.tar"},
	} {
		bin := filepath.Join(dir, b.bin)
		if err := BuildStatic(b.pkg, bin, ""); err != nil {
			return "", "", err
		}
		data, err := os.ReadFile(bin)
		if err != nil {
			return "", "", err
		}
		spec := OperatorImageSpec(data)
		if b.bin == "pause" {
			spec = PauseImageSpec(data)
		}
		if err := WriteImageArchive(spec, filepath.Join(dir, b.archive)); err != nil {
			return "", "", err
		}
	}
	return filepath.Join(dir, "operator.oci.tar"), filepath.Join(dir, "pause.oci.tar"), nil
}
