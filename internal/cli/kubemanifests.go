package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/kube"
)

// PodNameEnv names this pod (set by the rendered Deployment from the downward API): the
// gateway reports the manifest digest it serves as an annotation on that pod.
const PodNameEnv = "POD_NAME"

// kubeManifests starts following the rendered manifests of `gateway --kube-configmap
// NAMESPACE/NAME` (ConfigMap shards and the --kube-trusted-keys Secret, through the API) and
// loads them once: a rendering that fails verification at start is an error, never a start
// without rules (fail closed).
func kubeManifests(ctx context.Context, ref, keys, kubeconfig, namespace string, stderr io.Writer) (*kube.Manifests, []*manifest.Manifest, error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return nil, nil, fmt.Errorf("--kube-configmap %q: write NAMESPACE/NAME", ref)
	}
	cfg, _, err := kubeClientConfig(kubeconfig, namespace)
	if err != nil {
		return nil, nil, err
	}
	km, err := kube.WatchManifests(ctx, kube.ManifestOptions{Config: cfg, Namespace: ns, ConfigMap: name, TrustedKeysSecret: keys,
		PodName: os.Getenv(PodNameEnv), Logf: func(f string, a ...any) { fmt.Fprintf(stderr, f+"\n", a...) }})
	if err != nil {
		return nil, nil, err
	}
	ms, err := km.Load(ctx)
	if err != nil {
		km.Close()
		return nil, nil, fmt.Errorf("the manifests of --kube-configmap %s: %w", ref, err)
	}
	if keys == "" {
		fmt.Fprintf(stderr, "reversi-gateway: no --kube-trusted-keys: the manifests' signatures are not verified, only their checksums\n")
	}
	return km, ms, nil
}
