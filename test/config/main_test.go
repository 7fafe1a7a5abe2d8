// Package config tests the generated and hand-written install files in config/: that
// the committed CRDs, RBAC and deepcopy code are what controller-gen makes from the Go types
// today, that a real API server (envtest) accepts the CRDs, the samples and `kubectl apply -k
// config/default`, and that it refuses what the schemas forbid.
package config

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/reversi-gitops/reversi/internal/testenv"
)

// root is the repository root.
var root = testenv.Root

// The envtest control plane shared by the tests of this package (internal/testenv), started
// by the first test that needs it and stopped by TestMain, and the kubeconfig of its
// system:masters user, in a folder of its own that TestMain removes.
var (
	planeOnce  sync.Once
	plane      *testenv.Env
	kubeconfig string
	planeErr   error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if plane != nil {
		if err := plane.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the envtest control plane:", err)
		}
	}
	if kubeconfig != "" {
		_ = os.RemoveAll(filepath.Dir(kubeconfig))
	}
	os.Exit(code)
}

// env starts the shared control plane with the CRDs of config/crd/bases installed, or fails
// the test when it cannot.
func env(t *testing.T) *testenv.Env {
	t.Helper()
	planeOnce.Do(func() {
		e, err := testenv.Start()
		if err != nil {
			planeErr = err
			return
		}
		plane = e
		t.Logf("envtest control plane started in %s", e.Took.Round(time.Millisecond))
		dir, err := os.MkdirTemp("", "reversi-config-test-")
		if err != nil {
			planeErr = err
			return
		}
		if kubeconfig, planeErr = e.AdminKubeconfig(dir); planeErr != nil {
			_ = os.RemoveAll(dir)
		}
	})
	if planeErr != nil {
		t.Fatal(planeErr)
	}
	return plane
}

// kubectl runs the envtest kubectl against the control plane as a system:masters user and
// returns its combined output.
func kubectl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cp := env(t)
	cmd := exec.Command(cp.Kubectl(), append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// namespace creates a namespace for one test.
func namespace(t *testing.T, name string) string {
	t.Helper()
	ns := &corev1.Namespace{}
	ns.Name = name
	if err := env(t).Client.Create(t.Context(), ns); err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
	return name
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
