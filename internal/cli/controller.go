package cli

import (
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/controllers"
	"github.com/reversi-gitops/reversi/internal/source"
)

func init() { register(newControllerCmd) }

func newControllerCmd() *cobra.Command {
	var kubeconfig, metricsAddr, probeAddr, keysSecret, tempDir string
	var leaderElect, devLog, webhooks, allowFileURLs bool
	var maxFileBytes, maxTotalBytes int64
	var webhookPort int
	var webhookCertDir string
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the controller: ManifestRegistry, ToolManifest and ApprovalRequest reconcilers and the Approval webhooks (controller-runtime)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if maxFileBytes <= 0 || maxTotalBytes <= 0 {
				return fmt.Errorf("--source-max-file-bytes and --source-max-total-bytes must be positive")
			}
			ctrl.SetLogger(zap.New(zap.UseDevMode(devLog)))
			cfg, err := restConfig(kubeconfig)
			if err != nil {
				return err
			}
			mgr, err := ctrl.NewManager(cfg, ctrl.Options{
				Scheme:                 v1alpha1.NewScheme(),
				Metrics:                metricsserver.Options{BindAddress: metricsAddr},
				HealthProbeBindAddress: probeAddr,
				LeaderElection:         leaderElect,
				LeaderElectionID:       "reversi-controller.reversi.dev",
				WebhookServer:          webhook.NewServer(webhook.Options{Port: webhookPort, CertDir: webhookCertDir}),
			})
			if err != nil {
				return fmt.Errorf("starting the manager: %w", err)
			}
			if err := controllers.Setup(mgr, controllers.Options{TempDir: tempDir, ToolManifestKeysSecret: keysSecret, Webhooks: webhooks,
				AllowFileURLs: allowFileURLs, SourceMaxFileBytes: maxFileBytes, SourceMaxTotalBytes: maxTotalBytes}); err != nil {
				return err
			}
			if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
				return err
			}
			if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
				return err
			}
			return mgr.Start(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, or $KUBECONFIG)")
	f.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "where the metrics endpoint listens (0 turns it off)")
	f.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "where /healthz and /readyz listen")
	f.BoolVar(&leaderElect, "leader-elect", false, "elect a leader, so only one replica reconciles")
	f.StringVar(&keysSecret, "tool-manifest-keys-secret", controllers.TrustedKeysSecret, "the Secret, in each namespace, with the public keys ToolManifest signatures must verify against")
	f.StringVar(&tempDir, "temp-dir", "", "where fetched repositories are kept while a registry reconciles (default: the system temp folder)")
	f.BoolVar(&allowFileURLs, "allow-file-urls", false, "let ManifestRegistries use file:// URLs, which read repositories on the controller's own disk (demos and tests)")
	f.Int64Var(&maxFileBytes, "source-max-file-bytes", source.DefaultMaxFileBytes, "the largest file a registry may hold under spec.path, in bytes (also the largest object a git server may send)")
	f.Int64Var(&maxTotalBytes, "source-max-total-bytes", source.DefaultMaxTotalBytes, "the most bytes of files a registry may hold under spec.path (also per pack a git server sends)")
	f.BoolVar(&devLog, "dev-log", false, "human-readable logs")
	f.BoolVar(&webhooks, "webhooks", true, "serve the Approval admission webhooks (needs a serving certificate in --webhook-cert-dir)")
	f.IntVar(&webhookPort, "webhook-port", 9443, "port of the webhook server (HTTPS)")
	f.StringVar(&webhookCertDir, "webhook-cert-dir", "", "folder with tls.crt and tls.key (default $TMPDIR/k8s-webhook-server/serving-certs)")
	return cmd
}

// restConfig is the kubeconfig given, else controller-runtime's lookup (in-cluster, $KUBECONFIG).
func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return ctrl.GetConfig()
}
