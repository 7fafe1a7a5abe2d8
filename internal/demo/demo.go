// Package demo is the story `make demo` tells (hack/demo) and test/e2e/demo asserts: on a
// real control plane (envtest), the controller process (`reversi controller`) turns a signed
// git repository of manifests into ConfigMaps, and a gateway process configured exactly as the
// rendered Deployment's container (its args, its rendered gateway.yaml, a token of its
// ServiceAccount) fronts @modelcontextprotocol/server-memory for an agent. Every step that a
// person would do is a real kubectl, git or reversi command, printed as it runs (issue 9).
//
// The steps: a call without a manifest is blocked; a signed commit (a merged PR) adds a
// manifest that requires approval by finance, and the running gateway enforces it within
// seconds, without a restart; alice (group finance) approves with kubectl; `kubectl get
// reversiruns` shows the run; `kubectl patch` of spec.rollback undoes it; a signed commit adds a
// policy and the running gateway blocks a card number in a call's arguments; an unsigned (forged)
// commit is refused and never reaches the gateway; with the controller stopped, a hand edit of
// the rendered ConfigMap is refused by the gateway itself, and so is the complete signed rendering
// from before the PR put back (an older snapshot); the gateway's credentials cannot read other
// Secrets; server-memory runs as the rendered native sidecar behind `reversi stdio-bridge`, and
// when it dies mid-call the call is journaled uncertain, the bridge restarts it, and the pod
// stops as the kubelet stops it. Everything it starts is stopped, and its folder removed, before Run returns.
package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/reversi-gitops/reversi/api/manifest"
	"golang.org/x/sys/unix"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/internal/podrun"
	"github.com/reversi-gitops/reversi/internal/testenv"
	"github.com/reversi-gitops/reversi/pkg/bundle"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// Names of the story's objects.
const (
	Namespace = "agents"
	Registry  = "memory"
	Gateway   = "agents"
	Agent     = "agent-7"
	Approver  = "alice"
	// ServerImage is the image of the memory server's sidecar (allowed by the controller's
	// --upstream-images); the demo runs the sidecar's command with the host's node instead.
	ServerImage = "localhost/server-memory"
)

// Options configure Run.
type Options struct {
	// Out receives the story: each command as `$ …` and what it printed.
	Out io.Writer
	// Dir is the working folder (a new temporary one when empty). Run removes what it made
	// there unless Keep is set.
	Dir  string
	Keep bool
}

// Report is what happened, for the summary and for test/e2e/demo's assertions.
type Report struct {
	// Blocked is the gateway's answer to the call without a manifest.
	Blocked string
	// Read is the text of memory://knowledge-graph, read through the gateway (issue 19: the
	// whole protocol is relayed).
	Read string
	// Held is its answer to the same call after the merged PR (approval required), and
	// Enforced how long from `git commit` to that answer.
	Held     string
	Enforced time.Duration
	// Request is the ApprovalRequest; Approved is the answer to the retry after alice's
	// Approval, ApprovedAfter the time from her kubectl apply to the retry passing.
	Request       string
	Approved      string
	ApprovedAfter time.Duration
	// ForgedApproval is kubectl's refusal of an Approval whose spec.approver (alice, finance)
	// was written by another user; Again is the answer to the same call once more after the
	// approved retry (held for a new request: one approval, one call).
	ForgedApproval, Again string
	// Decisions are the run's decision records (seq, event, request, approver, groups).
	Decisions string
	// Run is the ReversiRun of the agent's session; Runs is `kubectl get reversiruns`
	// before the rollback and RolledBack after it; RollbackPhase its status.rollback.phase.
	Run, Runs, RolledBack, RollbackPhase string
	// GraphAfterRollback is memory.read_graph after the rollback.
	GraphAfterRollback string
	// Forged is the ManifestRegistry's Ready message after the unsigned commit, and
	// ForgedDigestKept whether the gateway still serves the digest it served before.
	Forged           string
	ForgedDigestKept bool
	// StillHeld is the answer to create_relations after the forged commit (still held for
	// approval: the rules of the last signed commit).
	StillHeld string
	// HandEdit is the refusal the gateway pod reports (annotation reversi.dev/manifest-error
	// on its Lease)
	// after the ConfigMap was edited by hand to an unsigned, looser manifest, and
	// HandEditHeld its answer to create_relations afterwards. Replay is its refusal of the
	// complete, signed rendering from before the PR put back (an older snapshot), and
	// ReplayHeld its answer to create_relations then.
	HandEdit, HandEditHeld, Replay, ReplayHeld string
	// Forbidden is kubectl's answer to the gateway's identity reading another Secret;
	// PatchPods and PatchOwnLease its answers to `kubectl auth can-i` patch pods and patch its
	// pod's Lease ("no" and "yes", issue 17).
	Forbidden, PatchPods, PatchOwnLease string
	// PolicyBlocked is the gateway's answer to a call carrying a card number once a signed
	// commit added the content policy, PolicyEnforced how long from `git commit` to that
	// answer, and PolicyPassed its answer to the same call with a number that is not a card's.
	PolicyBlocked, PolicyPassed string
	PolicyEnforced              time.Duration
	// Notified and NotifiedApproved are the approvers' webhook deliveries (issue 24) of the
	// held call (approval.requested) and of alice's approval (approval.approved): the event,
	// whether X-Reversi-Signature verified with the Secret's key, and the body;
	// NotifiedAfter is how long after the held answer the first arrived.
	Notified, NotifiedApproved Delivery
	NotifiedAfter              time.Duration
	// GatewayArgs is the argv the gateway process ran with (the Deployment's, localised).
	GatewayArgs []string
	// SidecarCommand is the argv the memory server's sidecar ran with (its rendered command,
	// the bridge in front of the server, localised).
	SidecarCommand []string
	// ServerPID is the server process the sidecar's bridge ran (its child); RestartedPID the
	// one it started after ServerPID was killed with a call in flight.
	ServerPID, RestartedPID int
	// Crashed is the gateway's answer to the call in flight when the server was killed;
	// AfterCrash its answer to the next call (served by the restarted server).
	Crashed, AfterCrash string
	// BeforeCrash is the graph read just before (the server keeps it in its file).
	BeforeCrash string
	// CrashStep is the step the gateway's ledger journals for the call in flight when the
	// server died; AfterCrashStep the run's next step (the first call after the restart).
	CrashStep, AfterCrashStep JournaledStep
	// BridgeStop is the sidecar's stop at the end, as the kubelet stops the pod: the gateway
	// first, then SIGTERM to the bridge process alone.
	BridgeStop BridgeStop
	// PIDs are the processes the story started (controller, gateway), and Dir its folder:
	// all gone when Run returns (unless Options.Keep or Options.Dir).
	PIDs []int
	Dir  string
}

// JournaledStep is a step of a run in the gateway's ledger: its intent's tool and its outcome.
type JournaledStep struct {
	Seq                 int64
	Tool, Outcome, Note string
}

// BridgeStop is how the sidecar's bridge stopped on SIGTERM.
type BridgeStop struct {
	// PID is the bridge's, Child the server it ran when it got SIGTERM.
	PID, Child int
	// Took is how long from SIGTERM to its exit, Status its exit status (-1: a signal ended it).
	Took   time.Duration
	Status int
	// Left are the processes of the bridge or of its server's process group after it exited.
	Left []int
}

// The manifests of the story, for server-memory fronted as upstream "memory".
const manifestsV1 = `# The memory tools the agent may use. Reviewed by the platform team.
- tool: memory.read_graph
  description: Read the whole knowledge graph.
  effect: read_only
  permission: memory:read
- tool: memory.open_nodes
  description: Read entities by name.
  effect: read_only
  permission: memory:read
- tool: memory.create_entities
  description: Create entities (existing names are left alone and not returned).
  effect: reversible
  permission: memory:write
  compensation:
    tool: memory.delete_entities
    kind: inverse
    argument_map:
      entityNames: $result.entities.*.name
    verification:
      tool: memory.open_nodes
      arguments: { names: $result.entities.*.name }
      expect: { entities: [] }
      retries: 3
      backoff_ms: 50ms
- tool: memory.delete_entities
  description: Delete entities and their relations.
  effect: idempotent
  permission: memory:admin
- tool: memory.delete_relations
  description: Delete relations.
  effect: idempotent
  permission: memory:admin
`

// The policy PR: rules about calls, beside the manifests (issue 21).
const policyContent = `# Card numbers never travel in tool arguments. Reviewed by the platform team.
policy: content
rules:
  - name: no-card-numbers
    condition: has_card_number(args)
    effect: deny
    reason: "the arguments carry a payment card number: pass the card vault's token instead"
tests:
  - name: a card number in an observation is blocked
    tool: memory.create_entities
    args: { entities: [{ name: acme-card, entityType: note, observations: ["pays with 4111 1111 1111 1111"] }] }
    expect: deny
  - name: a number that fails the Luhn check passes
    tool: memory.create_entities
    args: { entities: [{ name: acme-order, entityType: note, observations: ["order 4111 1111 1111 1112"] }] }
    expect: allow
`

// The merged PR: create_relations gets a manifest, and finance must approve each call.
const manifestRelations = `# Relations link customers to invoices: finance signs off on each one.
- tool: memory.create_relations
  description: Create relations between existing entities.
  effect: reversible
  permission: memory:write
  requires: [memory.create_entities]
  approval: { roles: [finance], quorum: 1, timeout: 30m }
  compensation:
    tool: memory.delete_relations
    kind: inverse
    argument_map:
      relations: $result.relations
    verification:
      tool: memory.open_nodes
      arguments: { names: $result.relations.*.from }
      expect: { relations: [] }
      backoff_ms: 50ms
`

// story is one run's state.
type story struct {
	out       io.Writer
	dir       string
	root      string
	bin       string // the reversi binary
	kubectlB  string
	admin     string // kubeconfigs
	alice     string
	gwKube    string
	env       *testenv.Env
	gitEnv    []string
	repo      string
	procs     []*podrun.Process
	report    Report
	agent     *mcp.ClientSession
	port      int
	podName   string
	dataDir   string // the gateway container's /var/lib/reversi (its store), a local folder
	logs      []string
	cleanupFn []func()
	// hook is the approvers' webhook receiver (spec.notifications).
	hook *hookReceiver
	// before is `<gateway>-manifests` as the controller rendered it before the PR: a
	// complete, signed, older rendering for the replay in step 7.
	before *corev1.ConfigMap
}

// Run tells the story. It returns the report and the first error; on error the report holds
// the steps that passed. Nothing it started is left running when it returns.
func Run(ctx context.Context, o Options) (rep *Report, err error) {
	s := &story{out: o.Out, root: testenv.Root}
	if s.out == nil {
		s.out = io.Discard
	}
	if o.Dir == "" {
		if s.dir, err = os.MkdirTemp("", "reversi-demo-"); err != nil {
			return nil, err
		}
	} else {
		s.dir = o.Dir
		if err := os.MkdirAll(s.dir, 0o700); err != nil {
			return nil, err
		}
	}
	defer func() {
		s.stop()
		if err != nil {
			for _, l := range s.logs {
				if b, rerr := os.ReadFile(l); rerr == nil {
					fmt.Fprintf(s.out, "\n--- %s (last 4 KiB) ---\n%s\n", filepath.Base(l), podrun.Tail(b, 4096))
				}
			}
		}
		if o.Keep {
			s.say("\nThe demo's files are kept in %s.", s.dir)
		} else if o.Dir == "" {
			_ = os.RemoveAll(s.dir)
		}
	}()
	s.report.Dir = s.dir
	for _, step := range []func(context.Context) error{
		s.prepare, s.controlPlane, s.repository, s.controller, s.registry, s.gateway,
		s.blocked, s.mergePR, s.approve, s.runs, s.rollback, s.policyPR, s.forged, s.handEdit, s.rbac, s.crash,
	} {
		if err := step(ctx); err != nil {
			return &s.report, err
		}
	}
	s.summary()
	return &s.report, nil
}

func (s *story) say(format string, args ...any) { fmt.Fprintf(s.out, format+"\n", args...) }

func (s *story) section(title string) { fmt.Fprintf(s.out, "\n== %s\n", title) }

// show prints a command as a person would type it (paths relative to the demo folder).
func (s *story) show(prefix string, argv []string) {
	q := make([]string, len(argv))
	for i, a := range argv {
		a = strings.ReplaceAll(a, s.dir+string(filepath.Separator), "")
		a = strings.ReplaceAll(a, s.root+string(filepath.Separator), "")
		if a == "" || strings.ContainsAny(a, " '\"{}*$") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		q[i] = a
	}
	fmt.Fprintf(s.out, "%s$ %s\n", prefix, strings.Join(q, " "))
}

// exec runs a command in dir, printing it and its output; it fails on a non-zero exit.
func (s *story) exec(ctx context.Context, dir string, env []string, stdin string, name string, args ...string) (string, error) {
	out, err := s.try(ctx, dir, env, stdin, name, args...)
	if err != nil {
		return out, fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return out, nil
}

// try is exec that returns a failing command's output with its error, for expected refusals.
func (s *story) try(ctx context.Context, dir string, env []string, stdin string, name string, args ...string) (string, error) {
	s.show("", append([]string{filepath.Base(name)}, args...))
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if len(out) > 0 {
		fmt.Fprintf(s.out, "%s", indent(string(out)))
	}
	return string(out), err
}

// kubectl runs the envtest kubectl as the admin user (system:masters).
func (s *story) kubectl(ctx context.Context, args ...string) (string, error) {
	return s.kubectlAs(ctx, s.admin, "", args...)
}

// kubectlAs runs kubectl with a user's kubeconfig (KUBECONFIG, so the printed command is
// the one a person types).
func (s *story) kubectlAs(ctx context.Context, kubeconfig, stdin string, args ...string) (string, error) {
	if kubeconfig != s.admin {
		fmt.Fprintf(s.out, "(as %s)\n", strings.TrimSuffix(filepath.Base(kubeconfig), ".kubeconfig"))
	}
	return s.exec(ctx, s.dir, []string{"KUBECONFIG=" + kubeconfig}, stdin, s.kubectlB, args...)
}

func (s *story) reversi(ctx context.Context, args ...string) (string, error) {
	return s.exec(ctx, s.dir, nil, "", s.bin, args...)
}

func (s *story) git(ctx context.Context, args ...string) (string, error) {
	return s.exec(ctx, s.repo, s.gitEnv, "", "git", args...)
}

func (s *story) write(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(content), 0o644)
}

// prepare builds what the demo needs: the envtest binaries, the npm MCP servers and reversi.
func (s *story) prepare(ctx context.Context) error {
	s.section("Build what the demo needs")
	s.say("The demo's folder is %s; the paths below are relative to it or to the repository.", s.dir)
	for tool, pkg := range map[string]string{"git": "git", "ssh-keygen": "openssh-client", "node": "nodejs", "npm": "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is needed by the demo and is not on PATH: install it (Debian: apt-get install %s)", tool, pkg)
		}
	}
	for _, script := range []struct{ path, env string }{{"hack/setup-envtest.sh", "KUBEBUILDER_ASSETS"}, {"hack/upstreams.sh", upstreams.EnvDir}} {
		if os.Getenv(script.env) != "" {
			s.say("%s=%s (already set)", script.env, os.Getenv(script.env))
			continue
		}
		s.show("", []string{script.path})
		cmd := exec.CommandContext(ctx, filepath.Join(s.root, script.path))
		cmd.Stderr = s.out
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("%s: %w", script.path, err)
		}
		dir := strings.TrimSpace(string(out))
		s.say("    %s=%s", script.env, dir)
		if err := os.Setenv(script.env, dir); err != nil {
			return err
		}
	}
	s.bin = filepath.Join(s.dir, "bin", "reversi")
	build := podrun.BuildCommand(ctx, s.root, s.bin)
	s.show("", build.Args)
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	_, err := s.reversi(ctx, "version")
	return err
}

// controlPlane starts kube-apiserver and etcd, with the Approval webhooks pointing at the
// address the controller process will serve, installs the CRDs and makes the namespace.
func (s *story) controlPlane(ctx context.Context) error {
	s.section("Start the control plane (envtest: kube-apiserver and etcd) and install the CRDs")
	env, err := testenv.Start(testenv.Options{Webhooks: true})
	if err != nil {
		return err
	}
	s.env = env
	s.cleanupFn = append(s.cleanupFn, func() { _ = env.Stop() })
	s.kubectlB = env.Kubectl()
	s.say("kube-apiserver at %s (up in %s)", env.Config.Host, env.Took.Round(time.Millisecond))
	if s.admin, err = env.AdminKubeconfig(s.dir); err != nil {
		return err
	}
	if s.alice, err = env.UserKubeconfig(s.dir, Approver, "finance"); err != nil {
		return err
	}
	s.say("users: admin (system:masters), alice (group finance)")
	s.say("(envtest installs config/crd/bases as it starts; kubectl applies the same files, as you would)")
	for _, args := range [][]string{
		{"apply", "--server-side", "-k", filepath.Join(s.root, "config", "crd")},
		{"create", "namespace", Namespace},
		{"create", "namespace", "reversi-system"}, // the controller keeps its signing key there
		{"apply", "-f", filepath.Join(s.root, "config", "rbac", "approver_role.yaml")},
		{"create", "rolebinding", "finance-approvers", "-n", Namespace, "--clusterrole=approver", "--group=finance"},
	} {
		if _, err := s.kubectl(ctx, args...); err != nil {
			return err
		}
	}
	return nil
}

// repository makes the team's manifest repository: a signed registry (reversi keygen,
// manifests publish) in a git repository whose commits are signed with an SSH key.
func (s *story) repository(ctx context.Context) error {
	s.section("The team's manifest repository: signed manifests, signed commits")
	keys := filepath.Join(s.dir, "keys")
	if err := os.MkdirAll(keys, 0o700); err != nil {
		return err
	}
	if _, err := s.reversi(ctx, "keygen", filepath.Join(keys, "manifests")); err != nil {
		return err
	}
	if _, err := s.exec(ctx, s.dir, nil, "", "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "platform-team", "-f", filepath.Join(keys, "git_ed25519")); err != nil {
		return err
	}
	home := filepath.Join(s.dir, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return err
	}
	s.gitEnv = []string{"HOME=" + home, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=" + os.DevNull, "GIT_TERMINAL_PROMPT=0", "LC_ALL=C"}
	s.repo = filepath.Join(s.dir, "tool-manifests")
	if _, err := s.exec(ctx, s.dir, s.gitEnv, "", "git", "init", "-q", "-b", "main", s.repo); err != nil {
		return err
	}
	for _, kv := range [][2]string{{"user.name", "Platform Team"}, {"user.email", "platform@example.com"},
		{"gpg.format", "ssh"}, {"user.signingkey", filepath.Join(keys, "git_ed25519")}, {"commit.gpgsign", "true"},
		// Serve partial clones, as hosted git servers do: the controller fetches only what it reads.
		{"uploadpack.allowFilter", "true"}} {
		if _, err := s.git(ctx, "config", kv[0], kv[1]); err != nil {
			return err
		}
	}
	if err := s.write(filepath.Join(s.repo, "drafts", "memory.yaml"), manifestsV1); err != nil {
		return err
	}
	s.say("tool-manifests/drafts/memory.yaml:\n%s", indent(manifestsV1))
	if _, err := s.exec(ctx, s.repo, nil, "", s.bin, "manifests", "publish", "drafts", "--registry", "registry", "--by", "platform-team",
		"--key", filepath.Join(keys, "manifests.key"), "--status", "approved", "--note", "memory tools"); err != nil {
		return err
	}
	if _, err := s.git(ctx, "add", "-A"); err != nil {
		return err
	}
	_, err := s.git(ctx, "commit", "-q", "-m", "memory tools: read, create entities (undone by delete)")
	return err
}

// controller starts `reversi controller` as its own process, serving the webhooks at the
// address envtest registered.
func (s *story) controller(ctx context.Context) error {
	s.section("Start the controller")
	wh := s.env.WebhookInstallOptions
	argv := []string{"controller", "--kubeconfig", s.admin, "--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--webhook-port", strconv.Itoa(wh.LocalServingPort), "--webhook-cert-dir", wh.LocalServingCertDir,
		"--temp-dir", filepath.Join(s.dir, "checkouts"),
		// The demo's repository is a folder on this machine.
		"--allow-file-urls", "--upstream-images", ServerImage + ":*"}
	if err := os.MkdirAll(filepath.Join(s.dir, "checkouts"), 0o700); err != nil {
		return err
	}
	if err := s.start("controller", s.bin, argv, os.Environ()); err != nil {
		return err
	}
	addr := net.JoinHostPort(wh.LocalServingHost, strconv.Itoa(wh.LocalServingPort))
	return podrun.Poll(ctx, 60*time.Second, func() string {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return "the controller's webhook server is not listening on " + addr
		}
		_ = c.Close()
		return ""
	})
}

// start runs a long-lived process in its own process group, its output in a log file.
func (s *story) start(name, bin string, argv, env []string) error {
	s.show("", append([]string{filepath.Base(bin)}, argv...))
	logPath := filepath.Join(s.dir, name+".log")
	p, err := podrun.Start(name, bin, argv, env, logPath)
	if err != nil {
		return err
	}
	s.say("    (%s running, pid %d, log %s)", name, p.PID(), filepath.Base(logPath))
	s.procs = append(s.procs, p)
	s.report.PIDs = append(s.report.PIDs, p.PID())
	s.logs = append(s.logs, logPath)
	return nil
}

// stop ends what the story started, newest first: processes (SIGTERM to their group, then
// SIGKILL after 10 s), then the control plane.
func (s *story) stop() {
	if s.agent != nil {
		_ = s.agent.Close()
		s.agent = nil
	}
	for i := len(s.procs) - 1; i >= 0; i-- {
		s.procs[i].Stop()
	}
	s.procs = nil
	for i := len(s.cleanupFn) - 1; i >= 0; i-- {
		s.cleanupFn[i]()
	}
	s.cleanupFn = nil
}

// registry applies the ManifestRegistry and its Secrets, and waits for the rendering.
func (s *story) registry(ctx context.Context) error {
	s.section("Point a ManifestRegistry at the repository")
	keys := filepath.Join(s.dir, "keys")
	for _, args := range [][]string{
		{"create", "secret", "generic", "manifest-keys", "-n", Namespace, "--from-file=platform.pem=" + filepath.Join(keys, "manifests.pub")},
		{"create", "secret", "generic", "committers", "-n", Namespace, "--from-file=platform.sshpub=" + filepath.Join(keys, "git_ed25519.pub")},
	} {
		if _, err := s.kubectl(ctx, args...); err != nil {
			return err
		}
	}
	y := fmt.Sprintf(`apiVersion: reversi.dev/v1alpha1
kind: ManifestRegistry
metadata: {name: %s, namespace: %s}
spec:
  url: file://%s
  ref: {branch: main}
  path: registry
  format: Registry
  interval: 1h
  verify:
    manifestKeysSecretRef: {name: manifest-keys}
    commit: {mode: HEAD, secretRef: {name: committers}}
`, Registry, Namespace, s.repo)
	if err := s.apply(ctx, "registry.yaml", y); err != nil {
		return err
	}
	if _, err := s.kubectl(ctx, "wait", "--for=condition=Ready", "manifestregistry/"+Registry, "-n", Namespace, "--timeout=60s"); err != nil {
		return err
	}
	_, err := s.kubectl(ctx, "get", "manifestregistries", "-n", Namespace)
	return err
}

// apply writes a manifest into the demo folder, prints it and applies it.
func (s *story) apply(ctx context.Context, name, content string) error {
	path := filepath.Join(s.dir, name)
	if err := s.write(path, content); err != nil {
		return err
	}
	s.say("%s:\n%s", name, indent(content))
	_, err := s.kubectl(ctx, "apply", "-f", path)
	return err
}

// gateway applies the ReversiGateway, waits for its rendering and runs its container's
// command as a local process: the Deployment's args, its volumes' files at local paths, its
// env, and a token of its ServiceAccount in place of the in-cluster credentials.
func (s *story) gateway(ctx context.Context) error {
	s.section("Deploy a ReversiGateway in front of server-memory")
	keyOut, err := s.reversi(ctx, "gateway", "keys", "add", "--principal", Agent, "--role", "agent", "-f", filepath.Join(s.dir, "keys", "gateway-keys.json"))
	if err != nil {
		return err
	}
	secret := lastLine(keyOut)
	if _, err := s.kubectl(ctx, "create", "secret", "generic", "gateway-keys", "-n", Namespace, "--from-file=keys.json="+filepath.Join(s.dir, "keys", "gateway-keys.json")); err != nil {
		return err
	}
	node, args, env, err := upstreams.MemoryCommand(filepath.Join(s.dir, "memory.jsonl"))
	if err != nil {
		return err
	}
	if s.port, err = podrun.FreePort(); err != nil {
		return err
	}
	// The approvers' webhook: the gateway posts to it when a call is held (issue 24). Its URL
	// and HMAC key are in a Secret; the controller renders them as the pod's environment.
	s.hook = newHookReceiver(hookKey)
	s.cleanupFn = append(s.cleanupFn, s.hook.srv.Close)
	if _, err := s.kubectl(ctx, "create", "secret", "generic", "approvers-hook", "-n", Namespace,
		"--from-literal=url="+s.hook.srv.URL+"/reversi", "--from-literal=hmac="+hookKey); err != nil {
		return err
	}
	var envYAML strings.Builder
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		fmt.Fprintf(&envYAML, "\n      - {name: %s, value: %q}", k, v)
	}
	// server-memory speaks stdio only: it runs as a container upstream, a native sidecar of
	// the gateway pod behind `reversi stdio-bridge` (issue 23). The image is what the pod
	// would pull; the demo runs the sidecar's rendered command with the host's node.
	y := fmt.Sprintf(`apiVersion: reversi.dev/v1alpha1
kind: ReversiGateway
metadata: {name: %s, namespace: %s}
spec:
  mode: enforce
  port: %d
  permissions: [memory:read, memory:write, memory:admin]
  upstreams:
  - name: memory
    container:
      image: %s:1
      command: [%s, %q]
      env:%s
  manifests: {registries: [%s]}
  trustedKeysSecretRef: {name: manifest-keys}
  auth: {keysSecretRef: {name: gateway-keys, key: keys.json}}
  notifications:
  - name: approvers
    type: Webhook
    urlSecretRef: {name: approvers-hook, key: url}
    secretRef: {name: approvers-hook, key: hmac}
    events: [approval.requested, approval.approved]
`, Gateway, Namespace, s.port, ServerImage, node, args[0], envYAML.String(), Registry)
	if err := s.apply(ctx, "gateway.yaml", y); err != nil {
		return err
	}
	k8s := s.env.Client
	gw := &v1alpha1.ReversiGateway{}
	var dep appsv1.Deployment
	depName := Gateway + "-gateway"
	if err := podrun.Poll(ctx, 60*time.Second, func() string {
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: Namespace, Name: depName}, &dep); err != nil {
			return "the controller has not rendered Deployment " + depName + ": " + err.Error()
		}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: Namespace, Name: Gateway}, gw); err != nil {
			return err.Error()
		}
		if gw.Status.Manifests == nil || gw.Status.Manifests.DesiredRevision == "" {
			return "ReversiGateway status.manifests is empty"
		}
		return ""
	}); err != nil {
		return err
	}
	if _, err := s.kubectl(ctx, "get", "deployment,service,serviceaccount,role,rolebinding,configmap", "-n", Namespace, "-l", "app.kubernetes.io/instance="+Gateway); err != nil {
		if _, err := s.kubectl(ctx, "get", "deployment,service,serviceaccount,role,rolebinding,configmap", "-n", Namespace); err != nil {
			return err
		}
	}

	// envtest runs no kubelet: the demo plays it for one pod of the Deployment.
	s.podName = depName + "-demo"
	kubelet := &podrun.Kubelet{Client: k8s, Config: s.env.Config, Dir: s.dir,
		BaseEnv: []string{"PATH=" + os.Getenv("PATH"), "HOME=" + filepath.Join(s.dir, "home")}}
	pod, err := kubelet.CreatePod(ctx, &dep, s.podName)
	if err != nil {
		return err
	}
	s.say("(envtest has no kubelet: the demo plays it for pod %s, and runs its containers as local processes)", s.podName)
	if err := s.sidecars(ctx, kubelet, pod); err != nil {
		return err
	}
	c, err := kubelet.Prepare(ctx, pod, dep.Spec.Template.Spec.Containers[0].Name)
	if err != nil {
		return err
	}
	s.gwKube = c.Kubeconfig
	s.say("(a token of ServiceAccount %s, as the kubelet mounts it: %s)", pod.Spec.ServiceAccountName, filepath.Base(c.Kubeconfig))
	s.report.GatewayArgs = c.Args
	if s.dataDir = c.Mounts["/var/lib/reversi"]; s.dataDir == "" {
		return fmt.Errorf("the gateway container mounts no /var/lib/reversi (its store): %v", c.Mounts)
	}
	if err := s.start("gateway", s.bin, c.Args, c.Env); err != nil {
		return err
	}
	desired := gw.Status.Manifests.DesiredRevision
	if err := podrun.Poll(ctx, 60*time.Second, func() string {
		if d := s.podDigest(ctx); d != desired {
			return fmt.Sprintf("pod %s reports manifest digest %q on its Lease, want %s", s.podName, d, desired)
		}
		return ""
	}); err != nil {
		return err
	}
	s.say("The pod reports what it serves on the Lease of its name, which the controller created for it (the gateway has no right on pods):")
	if _, err := s.kubectl(ctx, "get", "lease", s.podName, "-n", Namespace, "-o", `jsonpath={.metadata.annotations.reversi\.dev/manifest-digest} held by {.spec.holderIdentity}{"\n"}`); err != nil {
		return err
	}
	if _, err := s.kubectl(ctx, "get", "reversigateway", Gateway, "-n", Namespace, "-o", "wide"); err != nil {
		return err
	}
	if s.agent, err = podrun.ConnectAgent(ctx, "demo-agent", "http://127.0.0.1:"+strconv.Itoa(s.port)+"/mcp", secret); err != nil {
		return err
	}
	s.say("The agent %s is connected to http://127.0.0.1:%d/mcp with its API key.", Agent, s.port)
	return nil
}

// sidecars runs the pod's init containers as the kubelet would, in order: the copy of the
// bridge (run to its end), then each native sidecar (restartPolicy Always: started and kept),
// with their rendered command lines and environment and their volumes in local folders; it
// waits for each bridge's socket.
func (s *story) sidecars(ctx context.Context, kubelet *podrun.Kubelet, pod *corev1.Pod) error {
	for _, ic := range pod.Spec.InitContainers {
		c, err := kubelet.Prepare(ctx, pod, ic.Name)
		if err != nil {
			return err
		}
		argv := append(append([]string(nil), c.Command...), c.Args...)
		if ic.RestartPolicy == nil || *ic.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			s.show("", append([]string{filepath.Base(s.bin)}, argv...))
			cmd := exec.CommandContext(ctx, s.bin, argv...)
			cmd.Env = c.Env
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("init container %s: %v\n%s", ic.Name, err, out)
			}
			continue
		}
		s.say("Its sidecar %s: the server behind the bridge the init container copied", ic.Name)
		if err := s.start(ic.Name, argv[0], argv[1:], c.Env); err != nil {
			return err
		}
		s.report.SidecarCommand = argv
		socket := ""
		for i, a := range argv {
			if i > 0 && argv[i-1] == "--listen" {
				socket = strings.TrimPrefix(a, "unix://")
			}
		}
		bridge := s.procs[len(s.procs)-1].PID()
		if err := podrun.Poll(ctx, 30*time.Second, func() string {
			if fi, err := os.Stat(socket); err != nil || fi.Mode()&os.ModeSocket == 0 {
				return "the bridge of " + ic.Name + " is not listening on " + socket
			}
			if s.report.ServerPID = childOf(bridge); s.report.ServerPID == 0 {
				return "the bridge of " + ic.Name + " has not started its server"
			}
			return ""
		}); err != nil {
			return err
		}
		s.say("    (the bridge, pid %d, runs the server as its child, pid %d, and listens on %s)", bridge, s.report.ServerPID, filepath.Base(socket))
	}
	return nil
}

// crash kills the sidecar's server with a call in flight: the gateway answers that the outcome
// is uncertain (and journals it so), the bridge starts a new server, and the next call passes.
// Then the pod stops as the kubelet stops it (stopSidecar).
func (s *story) crash(ctx context.Context) error {
	s.section("10. The server dies mid-call: the call is journaled uncertain, the sidecar's bridge restarts it")
	server := s.report.ServerPID
	before, _, err := s.call(ctx, "memory.read_graph", map[string]any{})
	if err != nil {
		return err
	}
	s.report.BeforeCrash = before
	began := time.Now()
	// Frozen first, so that the call is surely in its stdin when it dies.
	if err := syscall.Kill(server, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("stopping the server %d: %w", server, err)
	}
	type answer struct {
		text  string
		isErr bool
		err   error
	}
	done := make(chan answer, 1)
	go func() {
		text, isErr, err := s.call(ctx, "memory.create_entities", map[string]any{"entities": []any{
			map[string]any{"name": "globex", "entityType": "customer", "observations": []any{"in flight"}}}})
		done <- answer{text, isErr, err}
	}()
	if err := waitStdin(ctx, server); err != nil {
		return err
	}
	s.say("$ kill -KILL %d    # the server, with memory.create_entities in its stdin", server)
	if err := syscall.Kill(server, syscall.SIGKILL); err != nil {
		return err
	}
	a := <-done
	if a.err != nil {
		return a.err
	}
	s.showCall("memory.create_entities", a.text, a.isErr)
	s.report.Crashed = a.text
	if !a.isErr || !strings.Contains(a.text, "uncertain") {
		return fmt.Errorf("the call in flight when the server died: %q, want an uncertain outcome", a.text)
	}
	var sidecar, gateway *podrun.Process
	for _, p := range s.procs {
		switch {
		case strings.HasPrefix(p.Name, "upstream-"):
			sidecar = p
		case p.Name == "gateway":
			gateway = p
		}
	}
	bridge := sidecar.PID()
	// The gateway notes each reconnection in its log: the next call is made once it has
	// reconnected to the new server, and must pass.
	reconnected := "upstream memory reconnected"
	seen := strings.Count(gateway.Output(), reconnected)
	if err := podrun.Poll(ctx, 30*time.Second, func() string {
		if c := childOf(bridge); c == 0 || c == server {
			return "the bridge has not started a new server"
		}
		if strings.Count(gateway.Output(), reconnected) == seen {
			return "the gateway has not noted " + reconnected
		}
		return ""
	}); err != nil {
		return err
	}
	s.report.RestartedPID = childOf(bridge)
	text, isErr, err := s.call(ctx, "memory.read_graph", map[string]any{})
	if err != nil || isErr {
		return fmt.Errorf("memory.read_graph, the first call after the restart: %v %s", err, text)
	}
	s.report.AfterCrash = text
	s.say("The bridge (pid %d) started a new server (pid %d); the gateway reconnected:", bridge, s.report.RestartedPID)
	s.showCall("memory.read_graph", s.report.AfterCrash, false)
	if err := s.crashJournal(ctx, began); err != nil {
		return err
	}
	return s.stopSidecar(ctx, gateway, sidecar)
}

// crashJournal reads the gateway's ledger (its SQLite store in the pod's data folder, opened
// beside the running gateway as another process on the folder would; the ReversiRun status
// mirrors it, but it is not written while the controller, its admission webhook, is stopped):
// the step of the call in flight when the server died, the last memory.create_entities of the
// agent's runs journaled since the crash began, and the run's next tool call.
func (s *story) crashJournal(ctx context.Context, since time.Time) error {
	st, err := store.OpenSQLite(s.dataDir, nil)
	if err != nil {
		return fmt.Errorf("opening the gateway's ledger in %s: %w", s.dataDir, err)
	}
	defer st.Close()
	return podrun.Poll(ctx, 10*time.Second, func() string {
		runs, err := st.ListRuns(ctx, store.RunFilter{Actor: Agent})
		if err != nil {
			return err.Error()
		}
		for _, run := range runs {
			recs, err := st.Records(ctx, run.ID, 0, 0)
			if err != nil {
				return err.Error()
			}
			crash := int64(0) // whatever its outcome
			for _, r := range recs {
				if r.Kind == store.KindIntent && r.Tool == "memory.create_entities" && !r.Time.Before(since) {
					crash = r.Seq
				}
			}
			if crash == 0 {
				continue
			}
			s.report.CrashStep = journaledStep(recs, crash)
			for _, r := range recs {
				if r.Kind == store.KindIntent && r.Seq > crash {
					s.report.AfterCrashStep = journaledStep(recs, r.Seq)
					if s.report.AfterCrashStep.Outcome == "" { // committed with the next write, or within 5 ms
						return fmt.Sprintf("step %d of run %s has no outcome yet", r.Seq, run.ID)
					}
					return ""
				}
			}
			return fmt.Sprintf("run %s journals no call after that in flight (step %d)", run.ID, crash)
		}
		return "the gateway's ledger has no memory.create_entities of " + Agent + " since the crash began"
	})
}

// journaledStep is step seq of recs: its intent's tool and its outcome ("" when none).
func journaledStep(recs []store.Record, seq int64) JournaledStep {
	j := JournaledStep{Seq: seq}
	for _, r := range recs {
		switch {
		case r.Kind == store.KindIntent && r.Seq == seq:
			j.Tool = r.Tool
		case r.Kind == store.KindOutcome && r.Step == seq:
			j.Outcome, j.Note = string(r.Status), r.Note
		}
	}
	return j
}

// stopSidecar stops the pod as the kubelet does, its main container before its sidecars: the
// gateway, then SIGTERM to the sidecar's bridge process alone (not its group), which must
// stop its server and exit by itself within 5 s, leaving no process of its own or of its
// server's process group.
func (s *story) stopSidecar(ctx context.Context, gateway, sidecar *podrun.Process) error {
	if s.agent != nil {
		_ = s.agent.Close()
		s.agent = nil
	}
	gateway.Stop()
	bridge := sidecar.PID()
	st := &s.report.BridgeStop
	st.PID = bridge
	// The gateway's connection ended: the bridge stops that server and starts the next.
	if err := podrun.Poll(ctx, 30*time.Second, func() string {
		if st.Child = childOf(bridge); st.Child == 0 || st.Child == s.report.RestartedPID {
			return "the bridge has not started its next server after the gateway hung up"
		}
		return ""
	}); err != nil {
		return err
	}
	began := time.Now()
	if err := sidecar.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	exited, werr := sidecar.Wait(5 * time.Second)
	st.Took = time.Since(began)
	if !exited {
		return fmt.Errorf("the bridge (pid %d) did not exit within 5 s of SIGTERM", bridge)
	}
	var ee *exec.ExitError
	switch {
	case werr == nil:
	case errors.As(werr, &ee):
		st.Status = ee.ExitCode() // -1 when a signal ended it
	default:
		return werr
	}
	st.Left = processesOf(st.Child, bridge)
	if len(st.Left) > 0 {
		return fmt.Errorf("the bridge exited (status %d) but left processes %v behind", st.Status, st.Left)
	}
	s.say("(the pod stops as the kubelet stops it, the gateway first, then SIGTERM to the bridge alone, pid %d: it stopped its server, pid %d, and exited by itself in %s with status %d; no process of either is left)",
		bridge, st.Child, st.Took.Round(time.Millisecond), st.Status)
	return nil
}

// processesOf are the processes that are one of pids or in the process group of one.
func processesOf(pids ...int) []int {
	var out []int
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		i := bytes.LastIndexByte(b, ')')
		f := strings.Fields(string(b[i+1:])) // state ppid pgrp …
		if err != nil || i < 0 || len(f) < 3 {
			continue
		}
		pgrp, _ := strconv.Atoi(f[2])
		for _, p := range pids {
			if pid == p || pgrp == p {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// waitStdin waits until pid's stdin pipe holds bytes it has not read (at most 10 s).
func waitStdin(ctx context.Context, pid int) error {
	f, err := os.Open(fmt.Sprintf("/proc/%d/fd/0", pid))
	if err != nil {
		return fmt.Errorf("the server's stdin: %w", err)
	}
	defer f.Close()
	return podrun.Poll(ctx, 10*time.Second, func() string {
		if n, err := unix.IoctlGetInt(int(f.Fd()), unix.TIOCINQ); err != nil || n == 0 {
			return fmt.Sprintf("the call has not reached the stopped server (%d bytes, %v)", n, err)
		}
		return ""
	})
}

// childOf is a child process of pid (the parent field of /proc/<n>/stat), 0 when it has none.
func childOf(pid int) int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces, so read after its last ')'.
		i := bytes.LastIndexByte(b, ')')
		if f := strings.Fields(string(b[i+1:])); i > 0 && len(f) > 1 && f[1] == strconv.Itoa(pid) {
			if c, err := strconv.Atoi(filepath.Base(filepath.Dir(st))); err == nil {
				return c
			}
		}
	}
	return 0
}

// podReport is an annotation of the Lease the gateway pod reports on (named as the pod,
// created by the controller; the gateway may patch only it): "" when absent.
func (s *story) podReport(ctx context.Context, annotation string) string {
	l := &coordinationv1.Lease{}
	if err := s.env.Client.Get(ctx, types.NamespacedName{Namespace: Namespace, Name: s.podName}, l); err != nil {
		return ""
	}
	return l.Annotations[annotation]
}

// podDigest is the manifest digest the gateway pod reports serving.
func (s *story) podDigest(ctx context.Context) string {
	return s.podReport(ctx, v1alpha1.AnnotationManifestDigest)
}

// call makes one tool call as the agent: the text and whether it is an error.
func (s *story) call(ctx context.Context, tool string, args map[string]any) (string, bool, error) {
	return podrun.CallTool(ctx, s.agent, tool, args)
}

func (s *story) showCall(tool string, text string, isErr bool) {
	mark := "ok"
	if isErr {
		mark = "error"
	}
	s.say("agent> %s\n    %s: %s", tool, mark, oneLine(text, 300))
}

var relation = map[string]any{"relations": []any{map[string]any{"from": "acme-corp", "to": "invoice-1042", "relationType": "owes"}}}

// blocked: the agent creates two entities (allowed) and links them; create_relations has no
// manifest, so the gateway blocks it.
func (s *story) blocked(ctx context.Context) error {
	s.section("1. A call without a manifest is blocked")
	text, isErr, err := s.call(ctx, "memory.create_entities", map[string]any{"entities": []any{
		map[string]any{"name": "acme-corp", "entityType": "customer", "observations": []any{"signed 2026-11"}},
		map[string]any{"name": "invoice-1042", "entityType": "invoice", "observations": []any{"EUR 1,200"}}}})
	if err != nil {
		return err
	}
	s.showCall("memory.create_entities", text, isErr)
	if isErr {
		return fmt.Errorf("memory.create_entities was refused: %s", text)
	}
	text, isErr, err = s.call(ctx, "memory.create_relations", relation)
	if err != nil {
		return err
	}
	s.showCall("memory.create_relations", text, isErr)
	if !isErr || !strings.HasPrefix(text, "Blocked by Reversi") {
		return fmt.Errorf("memory.create_relations without a manifest was not blocked: %s", text)
	}
	s.report.Blocked = text
	if err := s.read(ctx); err != nil {
		return err
	}
	s.before = &corev1.ConfigMap{}
	return s.env.Client.Get(ctx, types.NamespacedName{Namespace: Namespace, Name: Gateway + "-manifests"}, s.before)
}

// read: more than tools goes through the gateway; the agent reads the graph as a resource, and
// the read is journaled in its run.
func (s *story) read(ctx context.Context) error {
	const uri = "memory://knowledge-graph"
	res, err := s.agent.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
	if err != nil {
		return fmt.Errorf("resources/read %s through the gateway: %w", uri, err)
	}
	if len(res.Contents) == 0 || !strings.Contains(res.Contents[0].Text, "acme-corp") {
		return fmt.Errorf("resources/read %s: %+v, want the graph with acme-corp", uri, res.Contents)
	}
	s.report.Read = res.Contents[0].Text
	s.say("agent> resources/read %s\n    ok: %s", uri, oneLine(res.Contents[0].Text, 160))
	s.say("(resources, prompts, completions, logs, progress and the server's sampling requests go through the gateway too; reads are journaled in the run)")
	return nil
}

var requestID = regexp.MustCompile(`request (apr-[0-9a-z-]+) is waiting`)

// mergePR: a signed commit adds create_relations (finance approves each call); the registry
// is asked to reconcile now, and the running gateway enforces the new rule.
func (s *story) mergePR(ctx context.Context) error {
	s.section("2. A PR adds a manifest: enforced by the running gateway, no restart")
	before := s.podDigest(ctx)
	if err := s.write(filepath.Join(s.repo, "drafts", "relations.yaml"), manifestRelations); err != nil {
		return err
	}
	s.say("drafts/relations.yaml:\n%s", indent(manifestRelations))
	if _, err := s.exec(ctx, s.repo, nil, "", s.bin, "manifests", "publish", "drafts", "--registry", "registry",
		"--by", "platform-team", "--key", filepath.Join(s.dir, "keys", "manifests.key"), "--status", "approved", "--note", "finance approves relations"); err != nil {
		return err
	}
	if _, err := s.git(ctx, "add", "-A"); err != nil {
		return err
	}
	began := time.Now()
	if _, err := s.git(ctx, "commit", "-q", "-m", "memory.create_relations: finance approves each call (PR #7)"); err != nil {
		return err
	}
	if _, err := s.kubectl(ctx, "annotate", "--overwrite", "manifestregistry/"+Registry, "-n", Namespace, v1alpha1.AnnotationRequestedAt+"="+time.Now().UTC().Format(time.RFC3339Nano)); err != nil {
		return err
	}
	var text string
	if err := podrun.Poll(ctx, 30*time.Second, func() string {
		t, isErr, err := s.call(ctx, "memory.create_relations", relation)
		if err != nil {
			return err.Error()
		}
		if !isErr || !requestID.MatchString(t) {
			return "memory.create_relations is still answered: " + oneLine(t, 200)
		}
		text = t
		return ""
	}); err != nil {
		return err
	}
	s.report.Enforced = time.Since(began)
	s.showCall("memory.create_relations", text, true)
	s.report.Held = text
	s.report.Request = requestID.FindStringSubmatch(text)[1]
	s.say("git commit → enforced by the running gateway in %s (pod digest %s → %s)", s.report.Enforced.Round(time.Millisecond), short(before), short(s.podDigest(ctx)))
	held := time.Now()
	d, err := s.hook.wait(ctx, "approval.requested", 10*time.Second)
	if err != nil {
		return err
	}
	s.report.Notified, s.report.NotifiedAfter = d, time.Since(held)
	s.showDelivery(d)
	_, err = s.kubectl(ctx, "get", "approvalrequests", "-n", Namespace)
	return err
}

// showDelivery prints what the approvers' webhook received.
func (s *story) showDelivery(d Delivery) {
	verified := "X-Reversi-Signature verified with the Secret's key"
	if !d.Verified {
		verified = "X-Reversi-Signature DID NOT verify"
	}
	s.say("approvers' webhook <- POST %s (%s):\n    %s", d.Event, verified, oneLine(d.Body, 400))
}

// approve: alice (group finance) applies an Approval with kubectl; the agent's retry passes.
func (s *story) approve(ctx context.Context) error {
	s.section("3. Finance approves with kubectl; the agent's retry passes")
	y := fmt.Sprintf("apiVersion: reversi.dev/v1alpha1\nkind: Approval\nmetadata: {name: %s-alice, namespace: %s}\nspec:\n  requestRef: {name: %s}\n  decision: Approve\n  reason: invoice 1042 checked (FIN-12)\n",
		s.report.Request, Namespace, s.report.Request)
	if err := s.write(filepath.Join(s.dir, "approval.yaml"), y); err != nil {
		return err
	}
	// An approver cannot be written by hand: the webhook stamps who made the Approval.
	f := strings.Replace(strings.Replace(y, s.report.Request+"-alice", s.report.Request+"-forged", 1),
		"  decision: Approve\n", "  decision: Approve\n  approver: {username: alice, groups: [finance]}\n", 1)
	if err := s.write(filepath.Join(s.dir, "forged-approval.yaml"), f); err != nil {
		return err
	}
	s.say("forged-approval.yaml, written by admin, names alice as the approver:\n%s", indent(f))
	out, err := s.try(ctx, s.dir, []string{"KUBECONFIG=" + s.admin}, "", s.kubectlB, "apply", "-f", filepath.Join(s.dir, "forged-approval.yaml"))
	if err == nil {
		return fmt.Errorf("an Approval with a hand-written approver was admitted: %s", out)
	}
	s.report.ForgedApproval = oneLine(out, 300)
	s.say("approval.yaml:\n%s", indent(y))
	began := time.Now()
	if _, err := s.kubectlAs(ctx, s.alice, "", "apply", "-f", filepath.Join(s.dir, "approval.yaml")); err != nil {
		return err
	}
	var text string
	if err := podrun.Poll(ctx, 30*time.Second, func() string {
		t, isErr, err := s.call(ctx, "memory.create_relations", relation)
		if err != nil {
			return err.Error()
		}
		if isErr {
			return "the retry is still blocked: " + oneLine(t, 200)
		}
		text = t
		return ""
	}); err != nil {
		return err
	}
	s.report.ApprovedAfter = time.Since(began)
	s.report.Approved = text
	s.showCall("memory.create_relations (retry)", text, false)
	d, err := s.hook.wait(ctx, "approval.approved", 10*time.Second)
	if err != nil {
		return err
	}
	s.report.NotifiedApproved = d
	s.showDelivery(d)
	// One approval, one call: the same call again is held for a new request.
	again, isErr, err := s.call(ctx, "memory.create_relations", relation)
	if err != nil {
		return err
	}
	if !isErr {
		return fmt.Errorf("the same call ran a second time on one approval: %s", oneLine(again, 200))
	}
	s.report.Again = again
	s.showCall("memory.create_relations (once more)", again, true)
	_, err = s.kubectl(ctx, "get", "approvalrequests,approvals", "-n", Namespace)
	return err
}

// runs: the agent's session is a ReversiRun.
func (s *story) runs(ctx context.Context) error {
	s.section("4. The audit view: kubectl get reversiruns")
	if err := podrun.Poll(ctx, 30*time.Second, func() string {
		var l v1alpha1.ReversiRunList
		if err := s.env.Client.List(ctx, &l, client.InNamespace(Namespace)); err != nil {
			return err.Error()
		}
		for _, r := range l.Items {
			if r.Spec.Actor == Agent && r.Status.Counts.Succeeded >= 2 {
				s.report.Run = r.Name
				return ""
			}
		}
		return fmt.Sprintf("no ReversiRun of %s with the two calls that passed (%d runs)", Agent, len(l.Items))
	}); err != nil {
		return err
	}
	out, err := s.kubectl(ctx, "get", "reversiruns", "-n", Namespace)
	s.report.Runs = out
	if err != nil {
		return err
	}
	// The decisions are records of the run's ledger (issue 16): who approved, and the one use.
	if err := podrun.Poll(ctx, 10*time.Second, func() string {
		r := &v1alpha1.ReversiRun{}
		if err := s.env.Client.Get(ctx, types.NamespacedName{Namespace: Namespace, Name: s.report.Run}, r); err != nil {
			return err.Error()
		}
		for _, st := range r.Status.Steps {
			if st.Approval != nil && st.Approval.Event == "consumed" {
				return ""
			}
		}
		return "the run's consumed record is not mirrored yet"
	}); err != nil {
		return err
	}
	s.report.Decisions, err = s.kubectl(ctx, "get", "reversirun", s.report.Run, "-n", Namespace, "-o",
		`jsonpath={range .status.steps[?(@.outcome=="approval")]}{.seq}{"\t"}{.approval.event}{"\t"}{.approvalRequest}{"\t"}{.approval.approver}{" "}{.approval.groups}{"\n"}{end}`)
	return err
}

// rollback: an operator confirms the rollback with kubectl patch; the gateway undoes the
// relation and the entities, each read back.
func (s *story) rollback(ctx context.Context) error {
	s.section("5. Roll the run back")
	if _, err := s.kubectl(ctx, "patch", "reversirun", s.report.Run, "-n", Namespace, "--type", "merge", "-p", `{"spec":{"rollback":{"confirm":true}}}`); err != nil {
		return err
	}
	if err := podrun.Poll(ctx, 60*time.Second, func() string {
		r := &v1alpha1.ReversiRun{}
		if err := s.env.Client.Get(ctx, types.NamespacedName{Namespace: Namespace, Name: s.report.Run}, r); err != nil {
			return err.Error()
		}
		if rb := r.Status.Rollback; rb == nil || (rb.Phase != v1alpha1.RollbackSucceeded && rb.Phase != v1alpha1.RollbackPartiallySucceeded && rb.Phase != v1alpha1.RollbackFailed) {
			return fmt.Sprintf("status.rollback %+v", r.Status.Rollback)
		}
		s.report.RollbackPhase = r.Status.Rollback.Phase
		return ""
	}); err != nil {
		return err
	}
	out, err := s.kubectl(ctx, "get", "reversiruns", "-n", Namespace)
	if err != nil {
		return err
	}
	s.report.RolledBack = out
	if _, err := s.kubectl(ctx, "get", "reversirun", s.report.Run, "-n", Namespace, "-o", "jsonpath={range .status.rollback.steps[*]}{.tool}{' -> '}{.result}{'\\n'}{end}"); err != nil {
		return err
	}
	text, isErr, err := s.call(ctx, "memory.read_graph", map[string]any{})
	if err != nil {
		return err
	}
	s.showCall("memory.read_graph", text, isErr)
	s.report.GraphAfterRollback = text
	return nil
}

// forged: a commit that is not signed by a trusted committer loosens the rule; the controller
// refuses it and the gateway keeps serving what it served.
func (s *story) forged(ctx context.Context) error {
	s.section("7. A forged (unsigned) commit never reaches the gateway")
	before := s.podDigest(ctx)
	p := filepath.Join(s.repo, "registry")
	if err := s.write(filepath.Join(p, "NOTICE"), "approvals are no longer needed\n"); err != nil {
		return err
	}
	if _, err := s.git(ctx, "add", "-A"); err != nil {
		return err
	}
	if _, err := s.git(ctx, "-c", "commit.gpgsign=false", "-c", "user.name=Mallory", "commit", "-q", "-m", "drop the approval (unsigned)"); err != nil {
		return err
	}
	if _, err := s.kubectl(ctx, "annotate", "--overwrite", "manifestregistry/"+Registry, "-n", Namespace, v1alpha1.AnnotationRequestedAt+"="+time.Now().UTC().Format(time.RFC3339Nano)); err != nil {
		return err
	}
	if err := podrun.Poll(ctx, 30*time.Second, func() string {
		r := &v1alpha1.ManifestRegistry{}
		if err := s.env.Client.Get(ctx, types.NamespacedName{Namespace: Namespace, Name: Registry}, r); err != nil {
			return err.Error()
		}
		for _, c := range r.Status.Conditions {
			if c.Type == v1alpha1.ConditionReady && c.Status == metav1.ConditionFalse {
				s.report.Forged = c.Message
				return ""
			}
		}
		return "the registry still reports Ready"
	}); err != nil {
		return err
	}
	if _, err := s.kubectl(ctx, "get", "manifestregistries", "-n", Namespace); err != nil {
		return err
	}
	s.report.ForgedDigestKept = s.podDigest(ctx) == before && before != ""
	s.say("the gateway still serves %s", short(before))
	text, isErr, err := s.call(ctx, "memory.create_relations", relation)
	if err != nil {
		return err
	}
	s.showCall("memory.create_relations", text, isErr)
	s.report.StillHeld = text
	return nil
}

// handEdit: with the controller stopped (nothing re-renders), someone edits the gateway's
// ConfigMap by hand: create_relations without its approval rule, unsigned. The gateway
// verifies every signature itself, refuses the edit and keeps enforcing what it had.
func (s *story) handEdit(ctx context.Context) error {
	s.section("8. A ConfigMap edited by hand, or an older rendering put back, is refused by the gateway itself")
	ctrlProc := s.procs[0]
	ctrlProc.Stop()
	s.say("(the controller, pid %d, is stopped: nothing re-renders the ConfigMap)", ctrlProc.PID())
	name := Gateway + "-manifests"
	var cm corev1.ConfigMap
	if err := s.env.Client.Get(ctx, types.NamespacedName{Namespace: Namespace, Name: name}, &cm); err != nil {
		return err
	}
	b, err := bundle.Assemble([]map[string]string{cm.Data})
	if err != nil {
		return err
	}
	edited := false
	for i, e := range b.Entries {
		if e.Tool != "memory.create_relations" {
			continue
		}
		var raw map[string]any
		if err := json.Unmarshal(e.Manifest, &raw); err != nil {
			return err
		}
		delete(raw, "approval")
		m, errs := manifest.Validate(raw)
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		if b.Entries[i].Manifest, err = manifest.CanonicalJSON(m); err != nil {
			return err
		}
		if b.Entries[i].Checksum, err = manifest.Checksum(m); err != nil {
			return err
		}
		b.Entries[i].Signature, b.Entries[i].KeyID = "", ""
		edited = true
	}
	if !edited {
		return fmt.Errorf("ConfigMap %s has no memory.create_relations", name)
	}
	shards, err := b.Shards(0)
	if err != nil {
		return err
	}
	out := corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: cm.Labels, OwnerReferences: cm.OwnerReferences}, Data: shards[0]}
	s.report.HandEdit, s.report.HandEditHeld, err = s.replaceRefused(ctx, out, name+"-edited.yaml",
		"memory.create_relations without its approval rule, checksum recomputed, signature removed", "not signed")
	if err != nil {
		return err
	}
	return s.replay(ctx)
}

// replaceRefused writes cm to file, replaces the ConfigMap with it by kubectl, waits until the
// gateway pod reports a refusal holding want (on its Lease), and calls create_relations: it
// returns the refusal and the gateway's answer.
func (s *story) replaceRefused(ctx context.Context, cm corev1.ConfigMap, file, what, want string) (refusal, answer string, err error) {
	cm.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}
	y, err := yaml.Marshal(cm)
	if err != nil {
		return "", "", err
	}
	path := filepath.Join(s.dir, file)
	if err := s.write(path, string(y)); err != nil {
		return "", "", err
	}
	s.say("%s: %s", file, what)
	if _, err := s.kubectl(ctx, "replace", "-f", path); err != nil {
		return "", "", err
	}
	if err := podrun.Poll(ctx, 30*time.Second, func() string {
		if e := s.podReport(ctx, v1alpha1.AnnotationManifestError); strings.Contains(e, want) {
			refusal = e
			return ""
		}
		return fmt.Sprintf("the gateway pod reports no refusal naming %q on its Lease", want)
	}); err != nil {
		return "", "", err
	}
	if _, err := s.kubectl(ctx, "get", "lease", s.podName, "-n", Namespace, "-o", `jsonpath={.metadata.annotations.reversi\.dev/manifest-error}{"\n"}`); err != nil {
		return "", "", err
	}
	text, isErr, err := s.call(ctx, "memory.create_relations", relation)
	if err != nil {
		return "", "", err
	}
	s.showCall("memory.create_relations", text, isErr)
	return refusal, text, nil
}

// replay puts the rendering from before the PR back: complete and signed, but an older
// snapshot than the gateway served. The gateway keeps the sequence it served in its store and
// refuses it.
func (s *story) replay(ctx context.Context) (err error) {
	name := Gateway + "-manifests"
	out := corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: s.before.Labels, OwnerReferences: s.before.OwnerReferences}, Data: s.before.Data}
	s.report.Replay, s.report.ReplayHeld, err = s.replaceRefused(ctx, out, name+"-before-the-pr.yaml",
		"the rendering from before the PR, every signature intact", "older than")
	return err
}

// rbac: the gateway's identity reads its own keys but no other Secret, and patches no pod
// (only its pod's Lease).
func (s *story) rbac(ctx context.Context) error {
	s.section("9. The gateway's RBAC is its own")
	if _, err := s.kubectlAs(ctx, s.gwKube, "", "get", "secret", "manifest-keys", "-n", Namespace, "-o", "name"); err != nil {
		return err
	}
	out, err := s.try(ctx, s.dir, []string{"KUBECONFIG=" + s.gwKube}, "", s.kubectlB, "get", "secret", "committers", "-n", Namespace)
	if err == nil || !strings.Contains(out, "Forbidden") {
		return fmt.Errorf("the gateway's ServiceAccount read Secret committers: %v\n%s", err, out)
	}
	s.report.Forbidden = strings.TrimSpace(out)
	// Its only write outside its own objects is its pod's report, on the Lease of the pod's
	// name: it cannot patch a pod (another team's image, say).
	out, _ = s.try(ctx, s.dir, []string{"KUBECONFIG=" + s.gwKube}, "", s.kubectlB, "auth", "can-i", "patch", "pods", "-n", Namespace)
	s.report.PatchPods = strings.TrimSpace(out)
	out, _ = s.try(ctx, s.dir, []string{"KUBECONFIG=" + s.gwKube}, "", s.kubectlB, "auth", "can-i", "patch", "lease/"+s.podName, "-n", Namespace)
	s.report.PatchOwnLease = strings.TrimSpace(out)
	if s.report.PatchPods != "no" || s.report.PatchOwnLease != "yes" {
		return fmt.Errorf("the gateway's ServiceAccount: patch pods %q, patch its Lease %q; want no and yes", s.report.PatchPods, s.report.PatchOwnLease)
	}
	return nil
}

// policyPR: a signed commit adds a policy (published and signed in the registry like the
// manifests); the running gateway blocks a call whose arguments carry a card number, and lets
// one with a number that is no card's through.
func (s *story) policyPR(ctx context.Context) error {
	s.section("6. A PR adds a policy: a card number in the arguments is blocked")
	if err := s.write(filepath.Join(s.repo, "policy", "content.yaml"), policyContent); err != nil {
		return err
	}
	s.say("policy/content.yaml:\n%s", indent(policyContent))
	if _, err := s.exec(ctx, s.repo, nil, "", s.bin, "test", "--policy", "policy", "-m", "registry"); err != nil {
		return err
	}
	if _, err := s.exec(ctx, s.repo, nil, "", s.bin, "policy", "publish", "policy", "--registry", "registry",
		"--by", "platform-team", "--key", filepath.Join(s.dir, "keys", "manifests.key"), "--status", "approved", "--note", "no card numbers in arguments"); err != nil {
		return err
	}
	if _, err := s.git(ctx, "add", "-A"); err != nil {
		return err
	}
	began := time.Now()
	if _, err := s.git(ctx, "commit", "-q", "-m", "policy content: no card numbers in tool arguments (PR #9)"); err != nil {
		return err
	}
	if _, err := s.kubectl(ctx, "annotate", "--overwrite", "manifestregistry/"+Registry, "-n", Namespace, v1alpha1.AnnotationRequestedAt+"="+time.Now().UTC().Format(time.RFC3339Nano)); err != nil {
		return err
	}
	card := func(name, text string) map[string]any {
		return map[string]any{"entities": []any{map[string]any{"name": name, "entityType": "note", "observations": []any{text}}}}
	}
	var text string
	if err := podrun.Poll(ctx, 30*time.Second, func() string {
		t, isErr, err := s.call(ctx, "memory.create_entities", card("acme-card", "pays with 4111 1111 1111 1111"))
		if err != nil {
			return err.Error()
		}
		if !isErr || !strings.Contains(t, "card number") {
			return "the card number still passes: " + oneLine(t, 200)
		}
		text = t
		return ""
	}); err != nil {
		return err
	}
	s.report.PolicyEnforced = time.Since(began)
	s.showCall("memory.create_entities", text, true)
	s.report.PolicyBlocked = text
	t, isErr, err := s.call(ctx, "memory.create_entities", card("acme-order", "order 4111 1111 1111 1112"))
	if err != nil {
		return err
	}
	s.showCall("memory.create_entities", t, isErr)
	if isErr {
		return fmt.Errorf("a number that fails the Luhn check was refused: %s", t)
	}
	s.report.PolicyPassed = t
	s.say("git commit → policy enforced by the running gateway in %s", s.report.PolicyEnforced.Round(time.Millisecond))
	return nil
}

func (s *story) summary() {
	r := s.report
	s.section("Summary")
	s.say("  blocked      memory.create_relations had no manifest: blocked")
	s.say("  relayed      the agent read memory://knowledge-graph through the gateway, not only tools")
	s.say("  merged PR    a signed commit made it need finance's approval: enforced in %s, no restart", r.Enforced.Round(time.Millisecond))
	after := r.NotifiedAfter.Round(time.Millisecond).String() + " after the agent had the held answer"
	if r.NotifiedAfter < time.Millisecond {
		after = "by the time the agent had the held answer" // the hold commits its notification with it
	}
	s.say("  notified     the approvers' webhook got a signed approval.requested %s, then approval.approved", after)
	s.say("  approved     alice (finance) applied an Approval; the retry passed %s later", r.ApprovedAfter.Round(time.Millisecond))
	s.say("  forged vote  an Approval naming alice, written by admin, was refused at admission")
	s.say("  once         the same call again was held for a new request: one approval, one call")
	s.say("  audit        kubectl get reversiruns shows run %s, with who approved and the one use as records", r.Run)
	s.say("  rollback     kubectl patch … spec.rollback.confirm=true: %s", r.RollbackPhase)
	s.say("  policy       a signed commit added a policy: a card number in the arguments was blocked %s later", r.PolicyEnforced.Round(time.Millisecond))
	kept := "and the gateway kept the rules of the last signed commit"
	if !r.ForgedDigestKept {
		kept = "but the gateway's digest changed"
	}
	s.say("  forged       the controller refused an unsigned commit, %s", kept)
	s.say("  hand edit    an unsigned ConfigMap edit was refused by the gateway itself; the rule held")
	s.say("  replay       the signed rendering from before the PR, put back, was refused as older; the rule held")
	s.say("  RBAC         the gateway's ServiceAccount cannot read other Secrets nor patch pods; it reports on its pod's Lease")
	s.say("  stdio sidecar server-memory ran as a native sidecar behind reversi stdio-bridge; killed mid-call, the call was journaled uncertain and the bridge restarted it; on SIGTERM the bridge stopped it and exited")
	s.say("Everything the demo started is stopped now.")
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	return "    " + strings.ReplaceAll(s, "\n", "\n    ") + "\n"
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func short(digest string) string {
	if i := strings.IndexByte(digest, ':'); i >= 0 && len(digest) > i+13 {
		return digest[:i+13]
	}
	return digest
}
