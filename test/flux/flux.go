// Package flux runs real Flux controllers for tests: source-controller and
// kustomize-controller, built from their released modules by hack/setup-flux.sh (once, into a
// cache outside the repository), started as processes against an envtest control plane with
// their CRDs installed. source-controller serves its artifacts on 127.0.0.1.
//
// A controller that cannot be built or started fails the test, with the script's or the
// controller's output; nothing here skips.
package flux

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/reversi-gitops/reversi/internal/podrun"
)

// root is the repository root (found from this file's location).
var root = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}()

// Dir is the folder of the Flux binaries and CRDs: $REVERSI_FLUX, or what hack/setup-flux.sh
// prints (it builds the controllers once, then answers at once). It holds source-controller,
// kustomize-controller and crds/.
func Dir() (string, error) {
	if dir := os.Getenv("REVERSI_FLUX"); dir != "" {
		return dir, nil
	}
	cmd := exec.Command(filepath.Join(root, "hack", "setup-flux.sh"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/setup-flux.sh: %v\n%s", err, stderr.String())
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("hack/setup-flux.sh printed no folder\n%s", stderr.String())
	}
	return dir, nil
}

// CRDDir is the folder of the Flux CRDs in dir (a folder Dir returned), for
// envtest.Environment.CRDDirectoryPaths or InstallCRDs.
func CRDDir(dir string) string { return filepath.Join(dir, "crds") }

// InstallCRDs installs (or updates) the Flux CRDs of dir into the running control plane of
// env and waits until they are served.
func InstallCRDs(env *envtest.Environment, dir string) error {
	_, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{
		Paths:              []string{CRDDir(dir)},
		ErrorIfPathMissing: true,
	})
	if err != nil {
		return fmt.Errorf("installing the Flux CRDs of %s: %w", CRDDir(dir), err)
	}
	return nil
}

// Options change how Start runs the controllers.
type Options struct {
	// Namespace, when set, is the only namespace the controllers watch
	// (--watch-all-namespaces=false with RUNTIME_NAMESPACE); empty: all namespaces.
	Namespace string
	// NoCrossNamespaceRefs makes kustomize-controller refuse a sourceRef to another namespace
	// (--no-cross-namespace-refs=true), as multi-tenant installs run it.
	NoCrossNamespaceRefs bool
	// SkipKustomize starts source-controller only.
	SkipKustomize bool
}

// Flux is a running source-controller (and kustomize-controller).
type Flux struct {
	// Dir is the folder of the binaries and CRDs.
	Dir string
	// Source and Kustomize are the controller processes (Kustomize is nil with SkipKustomize).
	Source, Kustomize *podrun.Process
	// StorageAddr is source-controller's artifact server (host:port on 127.0.0.1), the host of
	// every status.artifact.url; StoragePath is the folder it serves.
	StorageAddr, StoragePath string
	// Kubeconfig is the file of the system:masters user the controllers run as.
	Kubeconfig string
}

// StartTimeout bounds how long Start waits for a controller to be ready.
const StartTimeout = 2 * time.Minute

// Start builds (or finds) the controllers, installs their CRDs into env (which must be
// started), runs them against it and waits until they report ready. They are stopped, with
// whatever they started, when the test ends; when the test has failed by then, the end of
// each controller's log is written to the test log.
func Start(t testing.TB, env *envtest.Environment, opts Options) *Flux {
	t.Helper()
	dir, err := Dir()
	if err != nil {
		t.Fatal(err)
	}
	if err := InstallCRDs(env, dir); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	kubeconfig, err := writeKubeconfig(env, work)
	if err != nil {
		t.Fatal(err)
	}
	f := &Flux{Dir: dir, Kubeconfig: kubeconfig, StoragePath: filepath.Join(work, "storage")}
	if err := os.MkdirAll(f.StoragePath, 0o700); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(work, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	env0 := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + home,
		"TMPDIR=" + work,
		"KUBECONFIG=" + kubeconfig,
	}
	common := []string{"--enable-leader-election=false", "--log-level=debug"}
	if opts.Namespace != "" {
		env0 = append(env0, "RUNTIME_NAMESPACE="+opts.Namespace)
		common = append(common, "--watch-all-namespaces=false")
	} else {
		common = append(common, "--watch-all-namespaces=true")
	}

	f.StorageAddr = freeAddr(t)
	health := freeAddr(t)
	args := append([]string{
		"--storage-path=" + f.StoragePath,
		"--storage-addr=" + f.StorageAddr,
		"--storage-adv-addr=" + f.StorageAddr,
		"--metrics-addr=" + freeAddr(t),
		"--health-addr=" + health,
	}, common...)
	f.Source = start(t, "source-controller", filepath.Join(dir, "source-controller"), args, env0, work)
	waitReady(t, f.Source, health, f.StorageAddr)

	if !opts.SkipKustomize {
		health := freeAddr(t)
		args := append([]string{
			"--metrics-addr=" + freeAddr(t),
			"--health-addr=" + health,
			fmt.Sprintf("--no-cross-namespace-refs=%t", opts.NoCrossNamespaceRefs),
		}, common...)
		f.Kustomize = start(t, "kustomize-controller", filepath.Join(dir, "kustomize-controller"), args, env0, work)
		waitReady(t, f.Kustomize, health, "")
	}
	return f
}

// writeKubeconfig adds a system:masters user for the controllers and writes its kubeconfig.
func writeKubeconfig(env *envtest.Environment, dir string) (string, error) {
	user, err := env.AddUser(envtest.User{Name: "flux", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", fmt.Errorf("adding the flux user: %w", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return "", fmt.Errorf("the flux user's kubeconfig: %w", err)
	}
	path := filepath.Join(dir, "kubeconfig")
	return path, os.WriteFile(path, kc, 0o600)
}

// start runs one controller in its own process group, its output in dir/<name>.log, and
// stops it at cleanup (dumping the log's end when the test failed).
func start(t testing.TB, name, bin string, args, env []string, dir string) *podrun.Process {
	t.Helper()
	p, err := podrun.Start(name, bin, args, env, filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		began := time.Now()
		p.Stop()
		t.Logf("%s stopped in %s", name, time.Since(began).Round(time.Millisecond))
		if t.Failed() {
			t.Logf("%s log (end):\n%s", name, p.Tail(16<<10))
		}
	})
	return p
}

// waitReady waits until the controller's /readyz answers 200 and, when storage is set, the
// artifact server accepts connections; it fails the test if the process exits first.
func waitReady(t testing.TB, p *podrun.Process, health, storage string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second}
	for {
		if exited, err := p.Exited(); exited {
			t.Fatalf("%s exited before it was ready (%v):\n%s", p.Name, err, p.Tail(16<<10))
		}
		ok := false
		if resp, err := hc.Get("http://" + health + "/readyz"); err == nil {
			ok = resp.StatusCode == http.StatusOK
			_ = resp.Body.Close()
		}
		if ok && storage != "" {
			c, err := net.DialTimeout("tcp", storage, time.Second)
			ok = err == nil
			if c != nil {
				_ = c.Close()
			}
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s not ready after %s:\n%s", p.Name, StartTimeout, p.Tail(16<<10))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// freeAddr is a 127.0.0.1 address whose port was just free.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// TarGz is the folder dir as a gzipped tarball, as source-controller stores an artifact and as
// `flux push artifact` makes an OCI layer (paths relative to dir, slash-separated).
func TarGz(t *testing.T, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = gz.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
