// Package testenv starts a real control plane for tests: kube-apiserver and etcd (envtest)
// built by hack/setup-envtest.sh, with the project's CRDs installed. It is the one harness of
// the envtest suites (controllers, test/config): a control plane that cannot start is an
// error for the caller to fail on, never a reason to skip.
package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// Root is the repository root (found from this file's location).
var Root = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}()

// AssetsDir is the folder of kube-apiserver, etcd and kubectl: $KUBEBUILDER_ASSETS, or what
// hack/setup-envtest.sh prints (it builds the binaries once, then answers at once).
func AssetsDir() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	cmd := exec.Command(filepath.Join(Root, "hack", "setup-envtest.sh"))
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

// Env is a running control plane.
type Env struct {
	*envtest.Environment
	Config *rest.Config
	Client client.Client
	Scheme *k8sruntime.Scheme
	// Took is how long kube-apiserver and etcd took to come up.
	Took time.Duration
}

// Start starts kube-apiserver and etcd with the CRDs of config/crd/bases (and, with
// Options.Webhooks, the webhook configurations of config/webhook). Stop it with Stop.
func Start(opts ...Options) (*Env, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	s := v1alpha1.NewScheme()
	e := &Env{Scheme: s, Environment: &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(Root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                s,
	}}
	for _, o := range opts {
		o.apply(e.Environment)
	}
	began := time.Now()
	if e.Config, err = e.Environment.Start(); err != nil {
		return nil, fmt.Errorf("starting envtest from %s: %w", assets, err)
	}
	e.Took = time.Since(began)
	if e.Client, err = client.New(e.Config, client.Options{Scheme: s}); err != nil {
		_ = e.Environment.Stop()
		return nil, err
	}
	return e, nil
}

// Kubectl is the kubectl binary built with the control plane.
func (e *Env) Kubectl() string { return filepath.Join(e.BinaryAssetsDirectory, "kubectl") }

// AdminKubeconfig adds a system:masters user named admin to the control plane and writes its
// kubeconfig to dir/kubeconfig (mode 0600), for kubectl. It returns the file's path.
func (e *Env) AdminKubeconfig(dir string) (string, error) {
	user, err := e.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", fmt.Errorf("adding the admin user: %w", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return "", fmt.Errorf("the admin user's kubeconfig: %w", err)
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		return "", err
	}
	return path, nil
}
