// Package image builds the project's container image from the Dockerfile with buildah (no
// daemon: vfs storage, chroot isolation) and runs its entrypoint. No base image can be pulled
// here, so it builds the Dockerfile's prebuilt path: the runtime stage FROM scratch around a
// static binary built on the host (--build-arg BINARY=prebuilt).
package image

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/internal/testenv"
)

// buildah finds buildah. Where it is missing but could be installed (root with apt-get, as
// .ci/run does) the test fails saying how; only where it cannot be installed does it skip.
func buildah(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("buildah"); err == nil {
		return p
	}
	_, aptErr := exec.LookPath("apt-get")
	if os.Geteuid() == 0 && aptErr == nil {
		t.Fatal("buildah is not installed: run `apt-get install -y buildah` (Debian's package; .ci/run installs it)")
	}
	t.Skip("buildah is not installed and cannot be installed here (needs root and apt-get): the image build is not tested")
	return ""
}

// run runs buildah with private storage under root (removed with the test) and returns stdout.
func run(t *testing.T, bin, root string, args ...string) string {
	t.Helper()
	full := append([]string{"--storage-driver", "vfs", "--root", filepath.Join(root, "storage"), "--runroot", filepath.Join(root, "run")}, args...)
	cmd := exec.Command(bin, full...)
	cmd.Env = append(os.Environ(), "BUILDAH_ISOLATION=chroot", "TMPDIR="+root)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("buildah %s: %v\n%s\n%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// The Dockerfile builds an image FROM scratch whose entrypoint is the static reversi binary,
// run as the numeric non-root user 65532, with CA certificates; `reversi version` runs inside it
// and prints what the same binary prints on the host.
func TestImageRunsReversiVersion(t *testing.T) {
	bin := buildah(t)
	root := t.TempDir()
	t.Cleanup(func() {
		_ = exec.Command(bin, "--storage-driver", "vfs", "--root", filepath.Join(root, "storage"), "--runroot", filepath.Join(root, "run"), "rm", "--all").Run()
	})

	// The build context holds only what the prebuilt stage copies.
	ctxDir := filepath.Join(root, "context")
	image := filepath.Join(ctxDir, "bin", "image")
	if err := os.MkdirAll(image, 0o755); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(image, "reversi"), ".")
	build.Dir = testenv.Root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build (CGO_ENABLED=0): %v\n%s", err, out)
	}
	certs, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	if err != nil {
		t.Fatalf("the host's CA bundle (Debian's ca-certificates): %v", err)
	}
	if err := os.WriteFile(filepath.Join(image, "ca-certificates.crt"), certs, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("static binary built in %s", time.Since(began).Round(time.Millisecond))

	began = time.Now()
	run(t, bin, root, "bud", "--isolation", "chroot", "--pull-never", "--build-arg", "BINARY=prebuilt",
		"-f", filepath.Join(testenv.Root, "Dockerfile"), "-t", "localhost/reversi:test", ctxDir)
	t.Logf("image built in %s", time.Since(began).Round(time.Millisecond))

	var inspect struct {
		OCIv1 struct {
			Config struct {
				User       string   `json:"User"`
				Entrypoint []string `json:"Entrypoint"`
				Cmd        []string `json:"Cmd"`
			} `json:"config"`
		} `json:"OCIv1"`
	}
	if err := json.Unmarshal([]byte(run(t, bin, root, "inspect", "--type", "image", "localhost/reversi:test")), &inspect); err != nil {
		t.Fatal(err)
	}
	cfg := inspect.OCIv1.Config
	if !slices.Equal(cfg.Entrypoint, []string{"/reversi"}) || cfg.User != "65532:65532" {
		t.Errorf("image config: entrypoint %q user %q, want [/reversi] and 65532:65532", cfg.Entrypoint, cfg.User)
	}
	ctr := strings.TrimSpace(run(t, bin, root, "from", "--pull-never", "localhost/reversi:test"))
	mnt := strings.TrimSpace(run(t, bin, root, "mount", ctr))
	var files []string
	if err := filepath.WalkDir(mnt, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(mnt, p)
			files = append(files, rel)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	if want := []string{"etc/ssl/certs/ca-certificates.crt", "reversi"}; !slices.Equal(files, want) {
		t.Errorf("the image holds %v, want only %v", files, want)
	}

	// The entrypoint, as the image's user: `reversi version` and `reversi gateway --help`.
	args := append([]string{"run", "--isolation", "chroot", "--user", cfg.User, ctr, "--"}, cfg.Entrypoint...)
	got := strings.TrimSpace(run(t, bin, root, append(args, "version")...))
	host, err := exec.Command(filepath.Join(image, "reversi"), "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got, "reversi ") || got != strings.TrimSpace(string(host)) {
		t.Errorf("reversi version in the image: %q, want what the binary prints on the host: %q", got, host)
	}
	for _, sub := range []string{"controller", "gateway"} {
		if out := run(t, bin, root, append(args, sub, "--help")...); !strings.Contains(out, "--kubeconfig") {
			t.Errorf("reversi %s --help in the image lacks --kubeconfig:\n%s", sub, out)
		}
	}
}
