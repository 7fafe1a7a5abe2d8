package testenv

import (
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// Options change what Start installs.
type Options struct {
	// Webhooks installs config/webhook/manifests.yaml with envtest's webhook support: the API
	// server calls the webhooks at a local address with a CA envtest makes; serve them with
	// WebhookServer.
	Webhooks bool
	// WebhookPaths are the files (or folders) of webhook configurations Webhooks installs
	// instead of config/webhook/manifests.yaml, such as the output of `kubectl kustomize
	// config/namespaced` (envtest reads only the webhook configurations of a file and keeps
	// their namespaceSelector).
	WebhookPaths []string
}

func (o Options) apply(env *envtest.Environment) {
	if o.Webhooks {
		paths := o.WebhookPaths
		if len(paths) == 0 {
			paths = []string{filepath.Join(Root, "config", "webhook", "manifests.yaml")}
		}
		env.WebhookInstallOptions = envtest.WebhookInstallOptions{Paths: paths}
	}
}

// WebhookServer is a controller-runtime webhook server on the address and certificate the
// control plane's webhook configurations call (Start with Options.Webhooks).
func (e *Env) WebhookServer() webhook.Server {
	o := e.WebhookInstallOptions
	return webhook.NewServer(webhook.Options{Host: o.LocalServingHost, Port: o.LocalServingPort, CertDir: o.LocalServingCertDir})
}

// UserKubeconfig adds a user authenticated by a client certificate (CN name, O groups; the
// API server adds system:authenticated) and writes its kubeconfig to dir/<name>.kubeconfig
// (mode 0600), for kubectl or a gateway. It returns the file's path. The user has no
// permissions until RBAC grants some (system:masters in groups grants all).
func (e *Env) UserKubeconfig(dir, name string, groups ...string) (string, error) {
	user, err := e.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return "", fmt.Errorf("adding the user %s: %w", name, err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return "", fmt.Errorf("the kubeconfig of %s: %w", name, err)
	}
	path := filepath.Join(dir, name+".kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		return "", err
	}
	return path, nil
}
