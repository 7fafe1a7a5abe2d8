// Package controllers holds one reconciler per kind, each in its own file with its envtest
// tests: ManifestRegistry (git → verified ConfigMaps) and ToolManifest (validation and
// signature of manifests applied as objects).
package controllers

import (
	"context"
	"fmt"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
)

// Options configure the reconcilers.
type Options struct {
	// TempDir holds git checkouts while a reconcile runs.
	TempDir string
	// ToolManifestKeysSecret is the Secret name holding ToolManifest trusted keys per namespace.
	ToolManifestKeysSecret string
	// MaxShardBytes is the manifest bytes per rendered ConfigMap (0: the default).
	MaxShardBytes int
	// Webhooks registers the admission webhooks on the manager's webhook server: Approval
	// (stamps), ApprovalRequest and ReversiRun (who may create them and write their status),
	// ReversiGateway (its author's rights and its image; issue 17), ManifestRegistry (its
	// author may read the Secrets it names).
	Webhooks bool
	// StampKey stamps Approvals (the webhook) and verifies the stamps (the ApprovalRequest
	// reconciler); EnsureStampKey reads it from its Secret. Nil: a key for this process only
	// (EphemeralStampKey), for tests.
	StampKey *StampKey
	// GatewayIdentities are the users standalone gateways (`reversi gateway --kubeconfig`)
	// authenticate as, "NAMESPACE/GATEWAY" (NAMESPACE may be "*") → username: they may create
	// that gateway's ApprovalRequests and ReversiRuns and write its runs' status, as the
	// ServiceAccount of a ReversiGateway may for its own (issue 16).
	GatewayIdentities GatewayIdentities
	// ControllerUsername is the username the manager authenticates as: the only one that may
	// write ApprovalRequest status. Empty: asked of the API server (SelfSubjectReview) at Setup
	// when Webhooks is set.
	ControllerUsername string
	// GatewayImage is the image of ReversiGateways without spec.image (DefaultGatewayImage
	// when empty).
	GatewayImage string
	// GatewayImages are the glob patterns (path.Match) of the images ReversiGateways may run
	// (ImagePolicy; issue 17). Empty: DefaultGatewayImages of GatewayImage (its repository,
	// with any tag or digest). They must allow GatewayImage; Setup fails otherwise.
	GatewayImages []string
	// UpstreamImages are the glob patterns of the images container upstreams of
	// ReversiGateways may run (issue 23), checked at admission and before rendering. Empty:
	// the GatewayImages policy.
	UpstreamImages []string
	// SigningKey signs the snapshot of every rendering (EnsureSigningKey reads it from its
	// Secret). Nil: a key for this process only (EphemeralSigningKey), for tests.
	SigningKey *SigningKey
	// AllowFileURLs lets ManifestRegistries use file:// URLs (repositories on the
	// controller's disk: demos and tests).
	AllowFileURLs bool
	// SourceMaxFileBytes and SourceMaxTotalBytes bound one file under a registry's spec.path
	// and all of them, in bytes (0: 4 MiB and 64 MiB).
	SourceMaxFileBytes, SourceMaxTotalBytes int64
	// SourceMaxFiles and SourceMaxRefs bound the entries under spec.path and the refs a git
	// server advertises (0: 100,000 and 50,000).
	SourceMaxFiles, SourceMaxRefs int
	// SourceMaxTimeout caps a registry's spec.timeout (0: 2 minutes); Concurrent is how many
	// registries reconcile at once (0: 4).
	SourceMaxTimeout time.Duration
	Concurrent       int
	// NoCrossNamespaceRefs refuses ManifestRegistries whose spec.sourceRef names a Flux source
	// in another namespace (`reversi controller --no-cross-namespace-refs`, as Flux's flag).
	NoCrossNamespaceRefs bool
	// FluxArtifactHosts are the hosts a Flux source's status.artifact.url may name
	// (`reversi controller --flux-artifact-hosts`): "HOST" on any port, "HOST:PORT", or "*"
	// for every host; empty: DefaultFluxArtifactHosts (a default Flux install).
	FluxArtifactHosts []string
	// WatchNamespaces are the only namespaces the controller works in (`reversi controller
	// --watch-namespaces`); empty: every namespace. The manager's cache must be limited to
	// the same namespaces (cache.Options.DefaultNamespaces): Setup cannot change the cache, but
	// it puts every admission webhook it registers behind a gate that refuses objects of other
	// namespaces (WatchedNamespaces, NamespaceNotWatchedError).
	WatchNamespaces []string
	// Alerts are the ManifestRegistry rendering alerts (issue 24): the receivers of
	// `reversi controller --notifications-config` (LoadNotificationsConfig) and the delivery
	// bounds. Nil or no receivers: no alerts.
	Alerts *AlertOptions
}

// Setup registers every reconciler with the manager, and with o.Webhooks the admission
// webhooks (limited to o.WatchNamespaces when set). Errors: an image policy that does not
// hold (GatewayImagePolicy), or a reconciler or webhook that cannot be registered.
func Setup(mgr ctrl.Manager, o Options) error {
	images, err := GatewayImagePolicy(o.GatewayImage, o.GatewayImages)
	if err != nil {
		return err
	}
	upstreamImages := images
	if len(o.UpstreamImages) > 0 {
		if upstreamImages, err = NewImagePolicy(o.UpstreamImages); err != nil {
			return fmt.Errorf("--upstream-images: %w", err)
		}
	}
	mgr, err = WatchedNamespaces(mgr, o.WatchNamespaces)
	if err != nil {
		return err
	}
	if o.SigningKey == nil {
		key, err := EphemeralSigningKey()
		if err != nil {
			return err
		}
		o.SigningKey = key
	}
	if o.StampKey == nil {
		key, err := EphemeralStampKey()
		if err != nil {
			return err
		}
		o.StampKey = key
	}
	if err := (&ManifestRegistryReconciler{
		Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("reversi-controller"),
		TempDir: o.TempDir, MaxShardBytes: o.MaxShardBytes, Key: o.SigningKey, APIReader: mgr.GetAPIReader(), AllowFileURLs: o.AllowFileURLs,
		SourceMaxFileBytes: o.SourceMaxFileBytes, SourceMaxTotalBytes: o.SourceMaxTotalBytes, SourceMaxFiles: o.SourceMaxFiles, SourceMaxRefs: o.SourceMaxRefs,
		SourceMaxTimeout: o.SourceMaxTimeout, Concurrent: o.Concurrent, NoCrossNamespaceRefs: o.NoCrossNamespaceRefs,
		FluxArtifactHosts: o.FluxArtifactHosts, Alerts: o.Alerts,
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&ToolManifestReconciler{Client: mgr.GetClient(), KeysSecret: o.ToolManifestKeysSecret}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&ReversiGatewayReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("reversi-controller"),
		Image: o.GatewayImage, Images: images, UpstreamImages: upstreamImages, MaxShardBytes: o.MaxShardBytes, Key: o.SigningKey, APIReader: mgr.GetAPIReader()}).SetupWithManager(mgr); err != nil {
		return err
	}
	if o.Webhooks {
		if err := (&ReversiGatewayWebhook{Client: mgr.GetClient(), Images: images, UpstreamImages: upstreamImages}).SetupWebhookWithManager(mgr); err != nil {
			return err
		}
		if err := (&ManifestRegistryWebhook{Client: mgr.GetClient()}).SetupWebhookWithManager(mgr); err != nil {
			return err
		}
	}
	return setupApprovals(mgr, o)
}

// WhoAmI is the username cfg authenticates as (a SelfSubjectReview, authentication.k8s.io/v1).
// Errors: the API server cannot be reached or refuses the review.
func WhoAmI(ctx context.Context, cfg *rest.Config) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("asking the API server who the controller is (SelfSubjectReview): %w", err)
	}
	if r.Status.UserInfo.Username == "" {
		return "", fmt.Errorf("the API server's SelfSubjectReview names no user for the controller")
	}
	return r.Status.UserInfo.Username, nil
}
