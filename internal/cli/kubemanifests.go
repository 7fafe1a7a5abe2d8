package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/kube"
	"github.com/reversi-gitops/reversi/gateway/proxy"
	"github.com/reversi-gitops/reversi/gateway/store"
	projconfig "github.com/reversi-gitops/reversi/internal/config"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// ControllerKeysEnv holds the controller's public keys (PEM), set by the rendered Deployment:
// the default of --kube-controller-keys.
const ControllerKeysEnv = "REVERSI_CONTROLLER_KEYS"

// PodNameEnv names this pod (set by the rendered Deployment from the downward API): the
// gateway reports the manifest digest it serves as annotations on the coordination.k8s.io
// Lease of that name in its namespace, which the ReversiGateway controller creates for the pod
// (the gateway may only patch it; it has no right on pods). Unset: no report.
const PodNameEnv = "POD_NAME"

// kubeManifests starts following the rendered manifests of `gateway --kube-configmap
// NAMESPACE/NAME` (ConfigMap shards and the --kube-trusted-keys Secret, through the API) and
// loads them once: a rendering that fails verification at start is an error, never a start
// without rules (fail closed). controllerKeys is --kube-controller-keys (a PEM file; default
// the PEM in $REVERSI_CONTROLLER_KEYS).
func kubeManifests(ctx context.Context, ref, keys, controllerKeys, gateway, kubeconfig, namespace string, stderr io.Writer) (*kube.Manifests, proxy.Loaded, error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return nil, proxy.Loaded{}, fmt.Errorf("--kube-configmap %q: write NAMESPACE/NAME", ref)
	}
	ctl, err := controllerTrust(controllerKeys)
	if err != nil {
		return nil, proxy.Loaded{}, err
	}
	if ctl == nil {
		return nil, proxy.Loaded{}, fmt.Errorf("--kube-configmap needs the controller's public keys (--kube-controller-keys FILE, or the PEM in $%s, as a ReversiGateway's pods get it; the controller publishes them in the ConfigMap reversi-controller-keys of its namespace): without them the rendering's set of manifests, revision and order cannot be verified", ControllerKeysEnv)
	}
	cfg, _, err := kubeClientConfig(kubeconfig, namespace)
	if err != nil {
		return nil, proxy.Loaded{}, err
	}
	km, err := kube.WatchManifests(ctx, kube.ManifestOptions{Config: cfg, Namespace: ns, ConfigMap: name, TrustedKeysSecret: keys,
		ControllerKeys: ctl, Gateway: gateway, PodName: os.Getenv(PodNameEnv), Logf: func(f string, a ...any) { fmt.Fprintf(stderr, f+"\n", a...) }})
	if err != nil {
		return nil, proxy.Loaded{}, err
	}
	ms, err := km.Load(ctx)
	if err != nil {
		km.Close()
		return nil, proxy.Loaded{}, fmt.Errorf("the manifests of --kube-configmap %s: %w", ref, err)
	}
	if keys == "" {
		fmt.Fprintf(stderr, "reversi-gateway: no --kube-trusted-keys: the manifests' signatures are not verified, only their checksums\n")
	}
	return km, ms, nil
}

// controllerTrust reads the controller's public keys: the PEM file path, else the PEM in
// $REVERSI_CONTROLLER_KEYS; nil when neither is set.
func controllerTrust(path string) (*signing.TrustSet, error) {
	if path != "" {
		t, err := signing.LoadTrustSet(path)
		if err != nil {
			return nil, fmt.Errorf("--kube-controller-keys: %w", err)
		}
		return t, nil
	}
	pem := os.Getenv(ControllerKeysEnv)
	if strings.TrimSpace(pem) == "" {
		return nil, nil
	}
	t, err := signing.ParseTrustSet([]byte(pem))
	if err != nil {
		return nil, fmt.Errorf("$%s: %w", ControllerKeysEnv, err)
	}
	return t, nil
}

// kubeNotificationReport is the loop that reports the summary of the notification outbox of
// st (the SQL store, before any Kubernetes wrapper) on the pod's Lease, beside the manifest
// digest (kube.Manifests.ReportNotifications, issue 24: the ReversiGateway's
// NotificationsDelivered condition); it runs until its context ends. Nil when the gateway has
// no receivers (gatewayReceivers). The receivers' URLs and keys are never reported. Errors:
// the receivers' configuration, or a store without an outbox summary.
func kubeNotificationReport(km *kube.Manifests, st store.Store, g *config.Gateway, pc *projconfig.Config, stderr io.Writer) (func(context.Context), error) {
	rs, err := gatewayReceivers(g, pc)
	if err != nil || len(rs) == 0 {
		return nil, err
	}
	sum, ok := st.(store.NotificationSummarizer)
	if !ok {
		return nil, errors.New("notifications: the store cannot summarize its outbox for the pod's report")
	}
	o := kube.NotificationReportOptions{Outbox: sum}
	for _, r := range rs {
		o.Receivers = append(o.Receivers, r.Name)
		o.Redact = append(o.Redact, r.URL, r.Secret)
	}
	return func(ctx context.Context) {
		if err := km.ReportNotifications(ctx, o); err != nil {
			fmt.Fprintf(stderr, "reversi-gateway: %v\n", err)
		}
	}, nil
}
