// Package config tests the generated and hand-written install files in config/: that
// the committed CRDs, RBAC and deepcopy code are what controller-gen makes from the Go types
// today, that a real API server (envtest) accepts the CRDs, the samples and `kubectl apply -k
// config/default`, and that it refuses what the schemas forbid.
package config

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// root is the repository root, relative to this package's folder (go test's working
// directory).
var root = filepath.Join("..", "..")

// plane is the envtest API server shared by the tests of this package, started by the first
// test that needs it and stopped by TestMain.
type plane struct {
	once    sync.Once
	env     *envtest.Environment
	cfg     *rest.Config
	client  client.Client
	kubectl string // path of the kubectl binary built with the control plane
	kubecfg string // kubeconfig file of a system:masters user
	err     error
	started time.Duration
}

var controlPlane plane

var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

func TestMain(m *testing.M) {
	code := m.Run()
	if env := controlPlane.env; env != nil {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the envtest control plane:", err)
		}
	}
	if controlPlane.kubecfg != "" {
		_ = os.RemoveAll(filepath.Dir(controlPlane.kubecfg))
	}
	os.Exit(code)
}

// assetsDir is the folder of kube-apiserver, etcd and kubectl: $KUBEBUILDER_ASSETS, or what
// hack/setup-envtest.sh prints (it builds the binaries once, then returns at once).
func assetsDir() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	cmd := exec.Command(filepath.Join(root, "hack", "setup-envtest.sh"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/setup-envtest.sh: %v\n%s", err, stderr.String())
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("hack/setup-envtest.sh printed no folder\n%s", stderr.String())
	}
	return dir, nil
}

// env starts the shared control plane with the CRDs of config/crd/bases installed, or fails
// the test when it cannot.
func env(t *testing.T) *plane {
	t.Helper()
	cp := &controlPlane
	cp.once.Do(func() {
		assets, err := assetsDir()
		if err != nil {
			cp.err = err
			return
		}
		began := time.Now()
		cp.env = &envtest.Environment{
			BinaryAssetsDirectory: assets,
			CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
			ErrorIfCRDPathMissing: true,
			Scheme:                scheme,
		}
		cp.cfg, err = cp.env.Start()
		if err != nil {
			cp.err = fmt.Errorf("starting envtest from %s: %w", assets, err)
			cp.env = nil
			return
		}
		cp.started = time.Since(began)
		t.Logf("envtest control plane started in %s", cp.started.Round(time.Millisecond))
		if cp.client, err = client.New(cp.cfg, client.Options{Scheme: scheme}); err != nil {
			cp.err = err
			return
		}
		user, err := cp.env.AddUser(envtest.User{Name: "installer", Groups: []string{"system:masters"}}, nil)
		if err != nil {
			cp.err = err
			return
		}
		kc, err := user.KubeConfig()
		if err != nil {
			cp.err = err
			return
		}
		dir, err := os.MkdirTemp("", "reversi-config-test-")
		if err != nil {
			cp.err = err
			return
		}
		cp.kubecfg = filepath.Join(dir, "kubeconfig")
		if err := os.WriteFile(cp.kubecfg, kc, 0o600); err != nil {
			cp.err = err
			return
		}
		cp.kubectl = filepath.Join(assets, "kubectl")
	})
	if cp.err != nil {
		t.Fatal(cp.err)
	}
	return cp
}

// kubectl runs the envtest kubectl against the control plane as a system:masters user and
// returns its combined output.
func kubectl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cp := env(t)
	cmd := exec.Command(cp.kubectl, append([]string{"--kubeconfig", cp.kubecfg}, args...)...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// namespace creates a namespace for one test.
func namespace(t *testing.T, name string) string {
	t.Helper()
	ns := &corev1.Namespace{}
	ns.Name = name
	if err := env(t).client.Create(t.Context(), ns); err != nil {
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
