package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/controllers"
	"github.com/reversi-gitops/reversi/pkg/source"
)

func init() { register(newControllerCmd) }

func newControllerCmd() *cobra.Command {
	var kubeconfig, metricsAddr, probeAddr, keysSecret, tempDir, signingKey, stampKey, gatewayImage, notificationsConfig string
	var gatewayIdentities, watchNamespaces, gatewayImages, upstreamImages, fluxArtifactHosts []string
	var leaderElect, devLog, webhooks, allowFileURLs, noCrossNamespaceRefs bool
	var maxFileBytes, maxTotalBytes int64
	var maxFiles, maxRefs, concurrent, apiBurst int
	var apiQPS float32
	var maxTimeout time.Duration
	var webhookPort int
	var webhookCertDir string
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the controller: the ManifestRegistry, ToolManifest, ReversiGateway and ApprovalRequest reconcilers and the admission webhooks (controller-runtime)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if maxFileBytes <= 0 || maxTotalBytes <= 0 || maxFiles <= 0 || maxRefs <= 0 || maxTimeout <= 0 || concurrent <= 0 {
				return fmt.Errorf("--source-max-file-bytes, --source-max-total-bytes, --source-max-files, --source-max-refs, --source-max-timeout and --concurrent must be positive")
			}
			images, err := gatewayImagePatterns(gatewayImage, gatewayImages, cmd.Flags().Changed("gateway-images"))
			if err != nil {
				return err
			}
			upImages, err := upstreamImagePatterns(upstreamImages, cmd.Flags().Changed("upstream-images"))
			if err != nil {
				return err
			}
			alerts, err := controllerAlerts(notificationsConfig)
			if err != nil {
				return err
			}
			ctrl.SetLogger(zap.New(zap.UseDevMode(devLog)))
			watched, err := controllers.CheckWatchNamespaces(watchNamespaces)
			if err != nil {
				return fmt.Errorf("--watch-namespaces: %w", err)
			}
			cfg, err := restConfig(kubeconfig)
			if err != nil {
				return err
			}
			cfg.QPS, cfg.Burst = apiQPS, apiBurst
			mgr, err := ctrl.NewManager(cfg, ctrl.Options{
				Scheme:                  v1alpha1.NewScheme(),
				Cache:                   watchCache(watched),
				Metrics:                 metricsserver.Options{BindAddress: metricsAddr},
				HealthProbeBindAddress:  probeAddr,
				LeaderElection:          leaderElect,
				LeaderElectionID:        "reversi-controller.reversi.dev",
				LeaderElectionNamespace: ownNamespace(),
				WebhookServer:           webhook.NewServer(webhook.Options{Port: webhookPort, CertDir: webhookCertDir}),
			})
			if err != nil {
				return fmt.Errorf("starting the manager: %w", err)
			}
			ids, err := parseGatewayIdentities(gatewayIdentities)
			if err != nil {
				return err
			}
			key, err := controllerSigningKey(cmd.Context(), cfg, signingKey)
			if err != nil {
				return err
			}
			stamp, err := controllerStampKey(cmd.Context(), cfg, stampKey)
			if err != nil {
				return err
			}
			if err := controllers.Setup(mgr, controllers.Options{TempDir: tempDir, ToolManifestKeysSecret: keysSecret, Webhooks: webhooks, SigningKey: key,
				StampKey: stamp, GatewayIdentities: ids, WatchNamespaces: watched, GatewayImage: gatewayImage, GatewayImages: images, UpstreamImages: upImages,
				AllowFileURLs: allowFileURLs, SourceMaxFileBytes: maxFileBytes, SourceMaxTotalBytes: maxTotalBytes,
				SourceMaxFiles: maxFiles, SourceMaxRefs: maxRefs, SourceMaxTimeout: maxTimeout, Concurrent: concurrent,
				NoCrossNamespaceRefs: noCrossNamespaceRefs, FluxArtifactHosts: fluxArtifactHosts, Alerts: alerts}); err != nil {
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
	f.BoolVar(&leaderElect, "leader-elect", false, "elect a leader, so only one replica reconciles (a Lease in $POD_NAMESPACE, else reversi-system)")
	f.StringSliceVar(&watchNamespaces, "watch-namespaces", nil, "NS[,NS...]: reconcile and admit objects only in these namespaces (the cache lists and watches nothing else, so namespaced RBAC suffices: config/namespaced); admission requests of other namespaces are refused (default: every namespace)")
	f.StringVar(&keysSecret, "tool-manifest-keys-secret", controllers.TrustedKeysSecret, "the Secret, in each namespace, with the public keys ToolManifest signatures must verify against")
	f.StringVar(&tempDir, "temp-dir", "", "where fetched repositories are kept while a registry reconciles (default: the system temp folder)")
	f.BoolVar(&allowFileURLs, "allow-file-urls", false, "let ManifestRegistries use file:// URLs, which read repositories on the controller's own disk (demos and tests)")
	f.Int64Var(&maxFileBytes, "source-max-file-bytes", source.DefaultMaxFileBytes, "the largest file a registry may hold under spec.path, in bytes (also the largest object a git server may send)")
	f.Int64Var(&maxTotalBytes, "source-max-total-bytes", source.DefaultMaxTotalBytes, "the most bytes of files a registry may hold under spec.path (also per pack a git server sends)")
	f.IntVar(&maxFiles, "source-max-files", source.DefaultMaxFiles, "the most files and folders a registry may hold under spec.path")
	f.IntVar(&maxRefs, "source-max-refs", source.DefaultMaxRefs, "the most refs a git server may advertise")
	f.DurationVar(&maxTimeout, "source-max-timeout", controllers.DefaultSourceMaxTimeout, "the longest a registry's fetch may take, whatever its spec.timeout says")
	f.BoolVar(&noCrossNamespaceRefs, "no-cross-namespace-refs", false, "refuse a ManifestRegistry whose spec.sourceRef names a Flux source in another namespace (as Flux's own flag: multi-tenant clusters set both)")
	f.StringSliceVar(&fluxArtifactHosts, "flux-artifact-hosts", controllers.DefaultFluxArtifactHosts, "the hosts a Flux source's status.artifact.url may name (source-controller's --storage-adv-addr): HOST (any port) or HOST:PORT, comma-separated or repeated; * allows every host, which lets anyone who may write a source's status make the controller fetch any URL it can reach")
	f.StringVar(&notificationsConfig, "notifications-config", "", "a YAML file of notifications: receivers in gateway.yaml's format (${NAME} read from the controller's environment) that get alert.rendering_refused when a ManifestRegistry revision is refused (commit or manifest signature, downgrade, ancestry, another registry) or a rendered ConfigMap drifted; see docs/notifications.md, Controller alerts (default: no alerts)")
	f.IntVar(&concurrent, "concurrent", controllers.DefaultConcurrent, "how many ManifestRegistries reconcile at once")
	f.Float32Var(&apiQPS, "kube-api-qps", 50, "requests per second to the API server (client-side limit)")
	f.IntVar(&apiBurst, "kube-api-burst", 300, "burst of requests to the API server (client-side limit)")
	f.StringVar(&signingKey, "signing-key-secret", "", "NAMESPACE/NAME of the Secret with the controller's own Ed25519 key, which signs every rendering's snapshot; created on first start (default: NAMESPACE/"+controllers.DefaultSigningKeySecret+", NAMESPACE being $POD_NAMESPACE or else reversi-system)")
	f.StringVar(&stampKey, "stamp-key-secret", "", "NAMESPACE/NAME of the Secret with the key that stamps Approvals at admission (only stamped Approvals count); created on first start; only the controller should read it (default: NAMESPACE/"+controllers.DefaultStampKeySecret+", NAMESPACE being $POD_NAMESPACE or else reversi-system)")
	f.StringArrayVar(&gatewayIdentities, "gateway-identity", nil, "NAMESPACE/GATEWAY=USERNAME: the user a standalone gateway (reversi gateway --kubeconfig) named GATEWAY authenticates as; it may create that gateway's ApprovalRequests and ReversiRuns and write its runs' status (NAMESPACE * for every namespace; repeatable). A ReversiGateway's own ServiceAccount needs no flag")
	f.BoolVar(&devLog, "dev-log", false, "human-readable logs")
	f.StringVar(&gatewayImage, "gateway-image", controllers.DefaultGatewayImage, "the image of ReversiGateways without spec.image (it runs reversi gateway)")
	f.StringSliceVar(&upstreamImages, "upstream-images", nil, "the images a ReversiGateway's container upstreams (spec.upstreams[].container.image, run as sidecars of the gateway pod) may run: glob patterns as for --gateway-images, comma-separated or repeated, e.g. registry.example/mcp/*. Admission refuses an image outside them and the controller renders nothing for one (reason ImageNotAllowed). Default: the --gateway-images patterns; set it so that server images need not be allowed as gateway images")
	f.StringSliceVar(&gatewayImages, "gateway-images", nil, "the images a ReversiGateway may run: glob patterns matched against the whole image string as spec.image writes it, with Go's path.Match (* is any run of characters but /, ? one character but /, [a-z] a class, \\ quotes), comma-separated or repeated, e.g. ghcr.io/acme/reversi:*,ghcr.io/acme/reversi@sha256:*. Admission refuses a spec.image outside them and the controller renders nothing for one (reason ImageNotAllowed). They must allow --gateway-image (default: its repository with no tag, any tag or any digest, e.g. reversi,reversi:*,reversi@sha256:*)")
	f.BoolVar(&webhooks, "webhooks", true, "serve the admission webhooks of Approvals, ApprovalRequests, ReversiRuns, ReversiGateways and ManifestRegistries (needs a serving certificate in --webhook-cert-dir)")
	f.IntVar(&webhookPort, "webhook-port", 9443, "port of the webhook server (HTTPS)")
	f.StringVar(&webhookCertDir, "webhook-cert-dir", "", "folder with tls.crt and tls.key (default $TMPDIR/k8s-webhook-server/serving-certs)")
	return cmd
}

// controllerAlerts reads --notifications-config (controllers.LoadNotificationsConfig, with
// the process's environment); nil when the flag is not given. A bad file is an error naming
// the file, the line and the field, before the controller connects anywhere.
func controllerAlerts(file string) (*controllers.AlertOptions, error) {
	if file == "" {
		return nil, nil
	}
	rs, err := controllers.LoadNotificationsConfig(file, os.LookupEnv)
	if err != nil {
		return nil, err
	}
	return &controllers.AlertOptions{Receivers: rs}, nil
}

// parseGatewayIdentities parses the --gateway-identity values (controllers.ParseGatewayIdentity);
// a NAMESPACE/GATEWAY given twice with different users is an error.
func parseGatewayIdentities(vals []string) (controllers.GatewayIdentities, error) {
	ids := controllers.GatewayIdentities{}
	for _, v := range vals {
		k, u, err := controllers.ParseGatewayIdentity(v)
		if err != nil {
			return nil, fmt.Errorf("--gateway-identity: %w", err)
		}
		if prev, ok := ids[k]; ok && prev != u {
			return nil, fmt.Errorf("--gateway-identity: %s is given twice, as %q and %q: name one user per gateway", k, prev, u)
		}
		ids[k] = u
	}
	return ids, nil
}

// ownNamespace is the controller's own namespace: $POD_NAMESPACE (the downward API in
// config/manager), else reversi-system.
func ownNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return "reversi-system"
}

// watchCache limits the manager's cache to namespaces (all of them when empty): informers
// list and watch only there, so the controller needs no cluster-wide read access.
func watchCache(namespaces []string) cache.Options {
	if len(namespaces) == 0 {
		return cache.Options{}
	}
	o := cache.Options{DefaultNamespaces: map[string]cache.Config{}}
	for _, ns := range namespaces {
		o.DefaultNamespaces[ns] = cache.Config{}
	}
	return o
}

// gatewayImagePatterns reads --gateway-images (controllers.ParseImagePatterns) and checks
// them with --gateway-image (controllers.GatewayImagePolicy) before the controller connects
// anywhere. A flag given but empty is an error (it would refuse every gateway).
func gatewayImagePatterns(image string, vals []string, given bool) ([]string, error) {
	patterns, err := controllers.ParseImagePatterns(vals)
	if err != nil {
		return nil, fmt.Errorf("--gateway-images: %w", err)
	}
	if given && len(patterns) == 0 {
		return nil, fmt.Errorf("--gateway-images is empty: every ReversiGateway would be refused; leave it out for the default (the repository of --gateway-image with any tag or digest)")
	}
	if _, err := controllers.GatewayImagePolicy(image, patterns); err != nil {
		return nil, err
	}
	return patterns, nil
}

// upstreamImagePatterns reads --upstream-images (controllers.ParseImagePatterns); nil when not
// given (the --gateway-images policy applies). A flag given but empty is an error.
func upstreamImagePatterns(vals []string, given bool) ([]string, error) {
	if !given {
		return nil, nil
	}
	patterns, err := controllers.ParseImagePatterns(vals)
	if err == nil && len(patterns) == 0 {
		return nil, fmt.Errorf("--upstream-images is empty: every container upstream would be refused; leave it out for the default (the --gateway-images patterns)")
	}
	if err == nil {
		_, err = controllers.NewImagePolicy(patterns)
	}
	if err != nil {
		return nil, fmt.Errorf("--upstream-images: %w", err)
	}
	return patterns, nil
}

// secretRef is ref (NAMESPACE/NAME) or, when empty, def in $POD_NAMESPACE (else reversi-system).
func secretRef(flag, ref, def string) (types.NamespacedName, error) {
	ns, name := ownNamespace(), def
	if ref != "" {
		var ok bool
		if ns, name, ok = strings.Cut(ref, "/"); !ok || ns == "" || name == "" {
			return types.NamespacedName{}, fmt.Errorf("%s %q: write NAMESPACE/NAME", flag, ref)
		}
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

// controllerStampKey reads (or, on first start, creates) the Approval stamp key in the Secret
// ref (NAMESPACE/NAME; default: $POD_NAMESPACE or reversi-system, and
// controllers.DefaultStampKeySecret), with a client that reads the API server directly.
func controllerStampKey(ctx context.Context, cfg *rest.Config, ref string) (*controllers.StampKey, error) {
	nn, err := secretRef("--stamp-key-secret", ref, controllers.DefaultStampKeySecret)
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return nil, err
	}
	return controllers.EnsureStampKey(ctx, c, nn)
}

// controllerSigningKey reads (or, on first start, creates) the controller's signing key in the
// Secret ref (NAMESPACE/NAME; default: $POD_NAMESPACE or reversi-system, and
// controllers.DefaultSigningKeySecret), with a client that reads the API server directly.
func controllerSigningKey(ctx context.Context, cfg *rest.Config, ref string) (*controllers.SigningKey, error) {
	nn, err := secretRef("--signing-key-secret", ref, controllers.DefaultSigningKeySecret)
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return nil, err
	}
	return controllers.EnsureSigningKey(ctx, c, nn)
}

// restConfig is the kubeconfig given, else controller-runtime's lookup (in-cluster, $KUBECONFIG).
func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return ctrl.GetConfig()
}
