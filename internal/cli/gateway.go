package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	apipolicy "github.com/reversi-gitops/reversi/api/policy"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/kube"
	"github.com/reversi-gitops/reversi/gateway/proxy"
	"github.com/reversi-gitops/reversi/gateway/store"
	projconfig "github.com/reversi-gitops/reversi/internal/config"
	"github.com/reversi-gitops/reversi/pkg/policy"
)

func init() { register(newGatewayCmd) }

// ManifestsEnv names the environment variable that names the gateway's manifests (seed "MCP
// gateway", Observe first).
const ManifestsEnv = "REVERSI_MANIFESTS"

// DefaultDataDir is the gateway's data folder when --data is not given.
const DefaultDataDir = ".reversi"

func newGatewayCmd() *cobra.Command {
	var (
		cfgFile, manifests, data, storeKind, runID, signingKey, dbURL string
		kubeconfig, namespace, kubeCM, kubeKeys, gatewayName          string
		kubeControllerKeys, environment                               string
		policies                                                      []string
		flags                                                         config.Flags
	)
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Run the MCP gateway (also installed as reversi-gateway)",
		Long: "Fronts one or more upstream MCP servers: every tools/call is decided by the manifests\n" +
			"and journaled (intent before forwarding, then the outcome). Speaks MCP on stdio, or\n" +
			"Streamable HTTP when gateway.yaml sets listen (beyond loopback only with auth). The same\n" +
			"program runs as reversi-gateway.\n\n" +
			"  reversi gateway --upstream-cmd npx --upstream-arg -y --upstream-arg my-mcp-server\n" +
			"  reversi gateway --config gateway.yaml --manifests ./manifests",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tuneGC()
			var g *config.Gateway
			if err := checkConfigDigest(cfgFile); err != nil {
				return err
			}
			if cfgFile != "" {
				file, errs := config.Load(cfgFile)
				if len(errs) > 0 {
					return errors.Join(errs...)
				}
				merged, err := config.Merge(file, flags)
				if err != nil {
					return err
				}
				g = merged
			} else {
				fg, err := config.FromFlags(flags)
				if err != nil {
					return err
				}
				g = fg
			}
			if runID != "" {
				if err := proxy.ValidateRunID(runID); err != nil {
					return fmt.Errorf("--run-id: %w", err)
				}
			}
			src, pc, err := manifestSource(manifests)
			if err != nil {
				return err
			}
			ppaths, err := gatewayPolicyPaths(policies, g)
			if err != nil {
				return err
			}
			if environment == "" {
				environment = g.Environment
			}
			var initial proxy.Loaded
			var load proxy.LoadFunc
			var kubeRun func(context.Context, kube.Target)
			var km *kube.Manifests // with --kube-configmap
			if kubeCM == "" && kubeKeys != "" {
				return errors.New("--kube-trusted-keys is for --kube-configmap: without it it would be ignored")
			}
			if kubeCM == "" && kubeconfig == "" && namespace == "" && kubeControllerKeys != "" {
				return errors.New("--kube-controller-keys is for --kube-configmap and the Kubernetes approval queue (--kubeconfig/--namespace): without them it would be ignored")
			}
			if kubeCM != "" && manifests != "" {
				return errors.New("--manifests and --kube-configmap name two sources of manifests: give one")
			}
			if kubeCM != "" && len(ppaths) > 0 {
				return errors.New("--policy (or policy: in gateway.yaml) with --kube-configmap: a ReversiGateway's policy comes with its rendering, not from a local file")
			}
			if kubeCM != "" { // the manifests come from the API server (ReversiGateway pods)
				m, l, err := kubeManifests(cmd.Context(), kubeCM, kubeKeys, kubeControllerKeys, gatewayName, kubeconfig, namespace, cmd.ErrOrStderr())
				if err != nil {
					return err
				}
				defer m.Close()
				km, initial, load, src, kubeRun = m, l, m.Load, "", m.Run
			} else if src != "" || len(ppaths) > 0 {
				if initial, err = loadGateway(src, ppaths); err != nil {
					return err
				}
				load = func(context.Context) (proxy.Loaded, error) { return loadGateway(src, ppaths) }
			}
			var st store.Store
			var runs *kube.Runs
			switch storeKind {
			case "memory":
				st = store.NewMemory(nil)
			case "sqlite":
				s, err := store.OpenSQLite(data, nil)
				if err != nil {
					return err
				}
				st = s
			case "postgres":
				s, err := openPostgres(cmd.Context(), dbURL)
				if err != nil {
					return err
				}
				st = s
			default:
				return fmt.Errorf("--store %q: use sqlite, postgres or memory", storeKind)
			}
			// The notification receivers' filters go on the SQL store itself, before any
			// wrapper and before the first call (issue 24).
			storeArgs := map[string]string{"sqlite": "--data " + data, "postgres": "--store postgres"}[storeKind]
			notifier, err := gatewayNotifier(cmd.Context(), st, g, pc, gatewayName, storeArgs, cmd.ErrOrStderr())
			if err != nil {
				_ = st.Close()
				return err
			}
			var reportNotes func(context.Context) // the outbox's summary on the pod's Lease (issue 24)
			if notifier != nil && km != nil {
				if reportNotes, err = kubeNotificationReport(km, st, g, pc, cmd.ErrOrStderr()); err != nil {
					_ = st.Close()
					return err
				}
			}
			if kubeconfig != "" || namespace != "" {
				kst, err := kubeApprovals(cmd.Context(), st, kubeconfig, namespace, gatewayName, kubeControllerKeys, cmd.ErrOrStderr())
				if err != nil {
					_ = st.Close()
					return err
				}
				st = kst
				if runs, err = kubeRuns(cmd.Context(), st, kubeconfig, namespace, gatewayName, cmd.ErrOrStderr()); err != nil {
					return err
				}
				st = runs
			}
			defer st.Close()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if recovered, err := st.Recover(ctx); err != nil {
				return err
			} else if len(recovered) > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "reversi-gateway: %d call(s) had no outcome journaled before the last stop; marked uncertain\n", len(recovered))
			}
			signer, err := gatewaySigner(cmd, signingKey)
			if err != nil {
				return err
			}
			var collectors []prometheus.Collector
			if notifier != nil {
				collectors = append(collectors, notifier.Collector())
				// What it has not delivered when the gateway stops stays pending in the store.
				nctx, ncancel := context.WithCancel(ctx)
				done := make(chan struct{})
				go func() { defer close(done); _ = notifier.Run(nctx) }()
				defer func() { ncancel(); <-done }() // before the store closes
			}
			gw, err := proxy.New(ctx, proxy.Options{Config: g, Manifests: initial.Manifests, Marks: initial.Marks, Revision: initial.Revision,
				Policy: initial.Policy, Environment: environment, Load: load, Store: st, RunID: runID, Name: gatewayName,
				Stdin: stdin(cmd), Stdout: stdout(cmd), Stderr: cmd.ErrOrStderr(), Egress: &pc.Egress, Signer: signer,
				Collectors: collectors})
			if err != nil {
				return err
			}
			defer gw.Close()
			if runs != nil {
				runs.Attach(gw) // spec.rollback of a ReversiRun runs through this gateway
			}
			watched := ppaths
			if src != "" {
				watched = append([]string{src}, ppaths...)
			}
			reloadTriggers(ctx, gw, watched, pc)
			if kubeRun != nil {
				go kubeRun(ctx, gw)
			}
			if reportNotes != nil { // it reads the store: stopped before the store closes
				rctx, rcancel := context.WithCancel(ctx)
				done := make(chan struct{})
				go func() { defer close(done); reportNotes(rctx) }()
				defer func() { rcancel(); <-done }()
			}
			stopProfile := startCPUProfile(cmd.ErrOrStderr())
			err = gw.Serve(ctx)
			stopProfile()
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfgFile, "config", "", "gateway.yaml (upstreams, mode, allow/deny, listen, ...)")
	f.StringVar(&manifests, "manifests", "", "manifest file, folder or registry (default: $"+ManifestsEnv+", manifests: in reversi.config.yaml, or ./manifests)")
	f.StringVar(&data, "data", DefaultDataDir, "data folder of the sqlite store (the ledger, and the high-water marks that refuse older manifests after a restart)")
	f.StringVar(&storeKind, "store", "sqlite", "sqlite, postgres (shared by replicas) or memory (keeps nothing across restarts, not even the high-water marks)")
	f.StringVar(&dbURL, "database-url", "", "URL of the postgres store (default $"+DatabaseURLEnv+")")
	f.StringVar(&flags.UpstreamCmd, "upstream-cmd", "", "command of one stdio upstream (without --config)")
	f.StringArrayVar(&flags.UpstreamArgs, "upstream-arg", nil, "argument of --upstream-cmd (repeatable)")
	f.StringVar(&flags.UpstreamURL, "upstream-url", "", "Streamable HTTP URL of one upstream (without --config)")
	f.StringVar(&flags.Mode, "mode", "", "enforce, advise or observe (default: observe without manifests, enforce with)")
	f.StringVar(&flags.Actor, "actor", "", "principal of the session's run (default mcp-client)")
	f.StringVar(&runID, "run-id", "", "continue this run (stdio)")
	f.StringVar(&gatewayName, "gateway-name", proxy.Name, "this gateway's name on its runs and approval requests (a ReversiGateway's pods pass its name)")
	f.StringVar(&signingKey, "signing-key", "", "Ed25519 private key (reversi keygen) that signs reversi.export_evidence")
	f.StringArrayVar(&policies, "policy", nil, "policy file or folder (repeatable; default: policy: in gateway.yaml, then in reversi.config.yaml)")
	f.StringVar(&environment, "environment", "", "the policy's environment variable, e.g. prod (default: environment: in gateway.yaml)")
	cmd.AddCommand(newGatewayKeysCmd())
	f.StringVar(&kubeconfig, "kubeconfig", "", "keep the approval queue (ApprovalRequests) and the runs (ReversiRuns) in Kubernetes, reached with this kubeconfig")
	f.StringVar(&kubeCM, "kube-configmap", "", "follow the manifests rendered into this ConfigMap (NAMESPACE/NAME) through the API, instead of --manifests")
	f.StringVar(&kubeKeys, "kube-trusted-keys", "", "with --kube-configmap: the Secret (in that namespace) of the Ed25519 public keys every manifest must be signed by")
	f.StringVar(&kubeControllerKeys, "kube-controller-keys", "", "with --kube-configmap or --kubeconfig/--namespace: a PEM file of the controller's public keys, which sign every rendering's snapshots and every approval decision (default: the PEM in $"+ControllerKeysEnv+")")
	f.StringVar(&namespace, "namespace", "", "namespace of the ApprovalRequests and ReversiRuns (default: the kubeconfig's; with only --namespace: in-cluster)")
	return cmd
}

// ConfigDigestEnv is set by a ReversiGateway's Deployment to `sha256:<hex>` of the gateway.yaml
// it rendered.
const ConfigDigestEnv = "REVERSI_CONFIG_DIGEST"

// checkConfigDigest refuses a --config file whose SHA-256 is not $REVERSI_CONFIG_DIGEST (when
// set): the ConfigMap it is mounted from was edited by someone other than the controller, who
// could loosen the mode or the allow list; the Deployment, which names the digest, was not.
func checkConfigDigest(path string) error {
	want := os.Getenv(ConfigDigestEnv)
	if want == "" {
		return nil
	}
	if path == "" {
		return fmt.Errorf("$%s is set but there is no --config to check", ConfigDigestEnv)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(data)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != want {
		return fmt.Errorf("%s has digest %s, but the Deployment expects %s: the gateway's config ConfigMap was changed by someone other than the controller; refusing to start (the controller restores it)", path, got, want)
	}
	return nil
}

// manifestSource names the gateway's manifests: --manifests, $REVERSI_MANIFESTS, manifests:
// in reversi.config.yaml, or ./manifests if that folder exists; "" when none applies, which is
// not an error: the gateway then starts in observe mode unless a mode is set. It also returns
// the project config (for the reload settings and the files a reload depends on).
func manifestSource(flag string) (string, *projconfig.Config, error) {
	c, err := projconfig.Find()
	if err != nil {
		return "", nil, err
	}
	p := flag
	if p == "" {
		p = os.Getenv(ManifestsEnv)
	}
	if p == "" {
		switch {
		case strings.Contains(c.Manifests, "://"):
			return "", nil, fmt.Errorf("manifests: %s: remote registries are not supported yet; clone the registry and name its folder", c.Manifests)
		case c.Manifests != "":
			p = c.Resolve(c.Manifests)
		default:
			if fi, err := os.Stat("manifests"); err == nil && fi.IsDir() {
				p = filepath.Clean("manifests")
			}
		}
	}
	return p, c, nil
}

// loadGatewayManifests reads the manifests at p (a registry is verified against the trusted
// keys read now, so a reload also picks up a rotated key) and, for a registry, its served
// policies (verified like its manifests, returned undecided in the second result for
// loadGateway to compile with any local policy). Every error at once.
// An existing folder that holds none yet is no manifests, not an error (seed: Observe first).
func loadGatewayManifests(p string) (proxy.Loaded, []*apipolicy.Policy, error) {
	var marks []store.HighWater
	var ps []*apipolicy.Policy
	ms, errs := loadManifestsAndPolicies([]string{p}, "", &marks, &ps)
	if len(errs) == 1 && errors.Is(errs[0], errNoManifests) {
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			return proxy.Loaded{}, nil, nil
		}
	}
	if len(errs) > 0 {
		return proxy.Loaded{}, nil, errors.Join(errs...)
	}
	l := proxy.Loaded{Manifests: ms, Marks: marks}
	if len(marks) > 0 {
		l.Revision = fmt.Sprintf("%s (sequence %d)", marks[0].Source, marks[0].Sequence)
	}
	return l, ps, nil
}

// gatewayPolicyPaths names the gateway's policy: --policy, policy: in gateway.yaml (resolved
// against its folder), or policy: in reversi.config.yaml; none is no policy.
func gatewayPolicyPaths(flags []string, g *config.Gateway) ([]string, error) {
	if len(flags) == 0 && g.Policy != "" {
		return []string{g.Resolve(g.Policy)}, nil
	}
	return projconfig.PolicyPaths(flags)
}

// loadGateway reads the manifests at p ("" for none) and the policy at ppaths (none: no
// policy), every error of both at once; a broken policy refuses the load like a broken
// manifest (the previous ones keep serving on a reload).
//
// A registry's served policies are enforced with any local policy: a policy named in both is an
// error (neither silently wins).
func loadGateway(p string, ppaths []string) (proxy.Loaded, error) {
	var l proxy.Loaded
	var errs []error
	var ps []*apipolicy.Policy
	if p != "" {
		var err error
		if l, ps, err = loadGatewayManifests(p); err != nil {
			errs = append(errs, err)
		}
	}
	fromRegistry := map[string]bool{}
	for _, rp := range ps {
		fromRegistry[rp.Name] = true
	}
	if len(ppaths) > 0 {
		local, perrs := apipolicy.ReadPaths(ppaths...)
		errs = append(errs, perrs...)
		for _, lp := range local {
			if fromRegistry[lp.Name] {
				errs = append(errs, fmt.Errorf("%s: policy %s is also served by the registry %s: give it another name, or publish it there (reversi policy publish)", lp.File, lp.Name, p))
			}
		}
		ps = append(ps, local...)
	}
	if len(errs) == 0 && len(ps) > 0 {
		set, perrs := policy.Compile(ps)
		errs = append(errs, perrs...)
		l.Policy = set
	}
	if len(errs) > 0 {
		return proxy.Loaded{}, errors.Join(errs...)
	}
	return l, nil
}

// reloadTriggers reloads gw on SIGHUP and, when there are manifests or a policy and the
// project config's reload.watch is on, when they or the files they depend on change, until
// ctx ends (seed: Hot reload). SIGHUP is always caught: a gateway started without manifests
// journals that there is nothing to reload instead of dying.
func reloadTriggers(ctx context.Context, gw *proxy.Gateway, watched []string, c *projconfig.Config) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				gw.Reload(ctx)
			}
		}
	}()
	if len(watched) > 0 && c.Reload.Watching() {
		go gw.Watch(ctx, c.Reload.Every(), append(watched, c.WatchedFiles()...)...)
	}
}

// stdin and stdout are the command's streams for MCP over stdio; nil (the process's own) when
// they were not replaced, so the SDK's stdio transport is used.
func stdin(cmd *cobra.Command) io.Reader {
	if r := cmd.InOrStdin(); r != os.Stdin {
		return r
	}
	return nil
}

func stdout(cmd *cobra.Command) io.Writer {
	if w := cmd.OutOrStdout(); w != os.Stdout {
		return w
	}
	return nil
}

// CPUProfileEnv names a file the gateway writes a CPU profile of its serving to (pprof), for
// hack/bench's profiles of the stdio gateway process, and its allocations to the same name
// with ".allocs" appended (pprof's allocs profile, as the process stops); unset, nothing is
// profiled.
const CPUProfileEnv = "REVERSI_CPUPROFILE"

func startCPUProfile(stderr io.Writer) (stop func()) {
	path := os.Getenv(CPUProfileEnv)
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		fmt.Fprintf(stderr, "reversi-gateway: %s: %v (no profile)\n", CPUProfileEnv, err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
		if a, err := os.Create(path + ".allocs"); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(a, 0)
			_ = a.Close()
		}
	}
}
