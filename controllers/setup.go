// Package controllers holds one reconciler per kind, each in its own file with its envtest
// tests: ManifestRegistry (git → verified ConfigMaps) and ToolManifest (validation and
// signature of manifests applied as objects).
package controllers

import (
	"time"

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
	// Webhooks registers the Approval admission webhooks on the manager's webhook server.
	Webhooks bool
	// GatewayImage is the image of ReversiGateways without spec.image (DefaultGatewayImage
	// when empty).
	GatewayImage string
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
}

// Setup registers every reconciler with the manager.
func Setup(mgr ctrl.Manager, o Options) error {
	if o.SigningKey == nil {
		key, err := EphemeralSigningKey()
		if err != nil {
			return err
		}
		o.SigningKey = key
	}
	if err := (&ManifestRegistryReconciler{
		Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("reversi-controller"),
		TempDir: o.TempDir, MaxShardBytes: o.MaxShardBytes, Key: o.SigningKey, APIReader: mgr.GetAPIReader(), AllowFileURLs: o.AllowFileURLs,
		SourceMaxFileBytes: o.SourceMaxFileBytes, SourceMaxTotalBytes: o.SourceMaxTotalBytes, SourceMaxFiles: o.SourceMaxFiles, SourceMaxRefs: o.SourceMaxRefs,
		SourceMaxTimeout: o.SourceMaxTimeout, Concurrent: o.Concurrent,
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&ToolManifestReconciler{Client: mgr.GetClient(), KeysSecret: o.ToolManifestKeysSecret}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&ReversiGatewayReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("reversi-controller"),
		Image: o.GatewayImage, MaxShardBytes: o.MaxShardBytes, Key: o.SigningKey, APIReader: mgr.GetAPIReader()}).SetupWithManager(mgr); err != nil {
		return err
	}
	return setupApprovals(mgr, o)
}
