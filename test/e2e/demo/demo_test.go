// Package demo runs the story of `make demo` (internal/demo) as the acceptance test of issue 9:
// a real control plane (envtest), the `reversi controller` process, a signed git repository, and
// a `reversi gateway` process started exactly as the rendered Deployment's container with a
// token of the rendered ServiceAccount, fronting @modelcontextprotocol/server-memory; every
// step is asserted here.
package demo

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/internal/demo"
	"github.com/reversi-gitops/reversi/test/syncbuf"
)

func TestDemoStory(t *testing.T) {
	out := &syncbuf.Buffer{}
	began := time.Now()
	r, err := demo.Run(t.Context(), demo.Options{Out: out})
	t.Logf("the demo took %s; its output:\n%s", time.Since(began).Round(time.Millisecond), out.String())
	if err != nil {
		t.Fatalf("the demo failed: %v", err)
	}

	// The gateway ran as the Deployment's container: its args, the manifests through the API,
	// the ServiceAccount's kubeconfig in place of in-cluster credentials.
	args := strings.Join(r.GatewayArgs, " ")
	for _, want := range []string{"gateway --config ", "--kube-configmap " + demo.Namespace + "/" + demo.Gateway + "-manifests", "--kube-trusted-keys manifest-keys", "--namespace " + demo.Namespace} {
		if !strings.Contains(args, want) {
			t.Errorf("the gateway's args %q lack %q", args, want)
		}
	}
	if i := slices.Index(r.GatewayArgs, "--kubeconfig"); i < 0 || !strings.HasSuffix(r.GatewayArgs[i+1], demo.Gateway+"-gateway.kubeconfig") {
		t.Errorf("the gateway does not run with its ServiceAccount's kubeconfig: %q", args)
	}

	// server-memory ran as the rendered sidecar (issue 23): the bridge the init container
	// copied into the pod's reversi-bin volume, listening in the sidecar's own socket folder,
	// in front of the server; the gateway reached it over that socket.
	sidecar := strings.Join(r.SidecarCommand, " ")
	if len(r.SidecarCommand) < 8 || !strings.HasSuffix(r.SidecarCommand[0], "/reversi-bin/reversi") ||
		!strings.Contains(sidecar, " stdio-bridge --listen unix://") || !strings.Contains(sidecar, "/upstream-0-run/memory.sock --session shared -- ") {
		t.Errorf("the sidecar's command %q is not the bridge from reversi-bin listening in upstream-0-run", sidecar)
	}

	// 10. The server killed with a call in flight: uncertain, then a new server behind the
	// same sidecar answers (issue 23).
	if !strings.Contains(r.Crashed, "outcome is uncertain") {
		t.Errorf("the call in flight when the server died: %q", r.Crashed)
	}
	if r.RestartedPID == 0 || r.RestartedPID == r.ServerPID || r.AfterCrash != r.BeforeCrash || !strings.Contains(r.AfterCrash, `"entities"`) {
		t.Errorf("after the crash: server %d → %d, read_graph %q (before %q); want a new server with the graph kept", r.ServerPID, r.RestartedPID, r.AfterCrash, r.BeforeCrash)
	}

	// The gateway's ledger says so: the call in flight is journaled uncertain, and the run's
	// next call (the first after the restart) succeeded.
	if c, a := r.CrashStep, r.AfterCrashStep; c.Tool != "memory.create_entities" || c.Outcome != "uncertain" ||
		a.Seq <= c.Seq || a.Tool != "memory.read_graph" || a.Outcome != "succeeded" {
		t.Errorf("the journaled steps of the crash: %+v, then %+v; want memory.create_entities uncertain, then memory.read_graph succeeded", c, a)
	}
	// The sidecar stopped as the kubelet stops it (the gateway first): SIGTERM to the bridge
	// alone, which stopped its server and exited by itself with the server's status (node
	// ended by SIGTERM: 128+15), leaving no process behind.
	if b := r.BridgeStop; b.PID == 0 || b.Child == 0 || b.Child == r.RestartedPID || b.Status != 128+int(syscall.SIGTERM) || b.Took > 5*time.Second || len(b.Left) != 0 {
		t.Errorf("the bridge's stop: %+v; want exit status %d within 5 s, nothing left", b, 128+int(syscall.SIGTERM))
	}
	for _, pid := range []int{r.BridgeStop.Child, r.BridgeStop.PID} {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); pid != 0 && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("process %d (the bridge or its last server) is still in /proc: %v", pid, err)
		}
	}

	// More than tools is relayed: the graph read as a resource, after the allowed call.
	if !strings.Contains(r.Read, "acme-corp") || !strings.Contains(r.Read, "invoice-1042") {
		t.Errorf("memory://knowledge-graph read through the gateway: %q", r.Read)
	}
	// 1. Blocked without a manifest.
	if !strings.HasPrefix(r.Blocked, "Blocked by Reversi: there is no manifest for memory.create_relations") {
		t.Errorf("the first call of memory.create_relations: %q", r.Blocked)
	}
	// 2. The merged PR is enforced by the running gateway in under 5 s.
	if !strings.Contains(r.Held, "memory.create_relations requires approval: request "+r.Request+" is waiting") || r.Request == "" {
		t.Errorf("after the PR: %q", r.Held)
	}
	t.Logf("git commit → new rule enforced by the running gateway: %s", r.Enforced.Round(time.Millisecond))
	if r.Enforced <= 0 || r.Enforced > 5*time.Second {
		t.Errorf("the new rule took %s to be enforced, want under 5 s", r.Enforced)
	}
	// 3. alice's Approval lets the retry through.
	// The approvers heard of the held call at once, and of alice's approval (issue 24).
	n, na := r.Notified, r.NotifiedApproved
	if n.Event != "approval.requested" || !n.Verified || n.Key != "approval.requested:"+r.Request ||
		!strings.Contains(n.Body, `"approval_id":"`+r.Request+`"`) || !strings.Contains(n.Body, `"tool":"memory.create_relations"`) ||
		!strings.Contains(n.Body, "reversi approve "+r.Request) {
		t.Errorf("the approvers' webhook on the held call: %+v", n)
	}
	if r.NotifiedAfter > 5*time.Second {
		t.Errorf("the approvers' webhook heard of the held call %s after it was held", r.NotifiedAfter)
	}
	if na.Event != "approval.approved" || !na.Verified || na.Key != "approval.approved:"+r.Request || !strings.Contains(na.Body, `"decided_by":["alice"]`) {
		t.Errorf("the approvers' webhook on the approval: %+v", na)
	}
	if !strings.Contains(r.Approved, `"relationType": "owes"`) {
		t.Errorf("the approved retry: %q", r.Approved)
	}
	t.Logf("kubectl apply of the Approval → retry passes: %s", r.ApprovedAfter.Round(time.Millisecond))
	// A hand-written approver is refused; one approval lets one call through (issue 16).
	if !strings.Contains(r.ForgedApproval, `spec.approver.username is "alice" but you are authenticated as "admin"`) {
		t.Errorf("the forged Approval: %q", r.ForgedApproval)
	}
	if !strings.Contains(r.Again, "memory.create_relations requires approval: request ") || strings.Contains(r.Again, r.Request) {
		t.Errorf("the same call after the approved retry: %q, want held for a new request", r.Again)
	}
	// 4. kubectl get reversiruns shows the agent's run.
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(r.Run) + `\s+` + demo.Agent + `\s`).MatchString(r.Runs) {
		t.Errorf("kubectl get reversiruns does not show run %q of %s:\n%s", r.Run, demo.Agent, r.Runs)
	}
	// The decisions are records of the run: alice (finance) counted, the approval consumed.
	for _, want := range []string{"counted\t" + r.Request + "\talice", "approved\t" + r.Request, "consumed\t" + r.Request} {
		if !strings.Contains(r.Decisions, want) {
			t.Errorf("the run's decision records lack %q:\n%s", want, r.Decisions)
		}
	}
	// 5. The rollback undid both changes: server-memory's graph is empty again.
	if r.RollbackPhase != "Succeeded" || !regexp.MustCompile(regexp.QuoteMeta(r.Run)+`.*\sRolledBack\s.*\sSucceeded\s`).MatchString(r.RolledBack) {
		t.Errorf("rollback %q:\n%s", r.RollbackPhase, r.RolledBack)
	}
	var graph struct {
		Entities  []any `json:"entities"`
		Relations []any `json:"relations"`
	}
	if err := json.Unmarshal([]byte(r.GraphAfterRollback), &graph); err != nil || len(graph.Entities) != 0 || len(graph.Relations) != 0 {
		t.Errorf("the graph after the rollback: %v %q", err, r.GraphAfterRollback)
	}
	// 6. The policy PR: a card number is blocked by the running gateway, a non-card number passes.
	if !strings.HasPrefix(r.PolicyBlocked, "Blocked by Reversi: the arguments carry a payment card number") || r.PolicyPassed == "" {
		t.Errorf("after the policy PR: %q, then %q", r.PolicyBlocked, r.PolicyPassed)
	}
	if r.PolicyEnforced <= 0 || r.PolicyEnforced > 5*time.Second {
		t.Errorf("the policy took %s to be enforced, want under 5 s", r.PolicyEnforced)
	}
	// 7. The forged commit never reached the gateway.
	if !strings.Contains(r.Forged, "not signed") || !r.ForgedDigestKept || !strings.Contains(r.StillHeld, "requires approval") {
		t.Errorf("after the unsigned commit: registry %q, digest kept %v, gateway answers %q", r.Forged, r.ForgedDigestKept, r.StillHeld)
	}
	// 8. A ConfigMap edited by hand (unsigned, looser) is refused by the gateway itself.
	if !strings.Contains(r.HandEdit, "memory.create_relations") || !strings.Contains(r.HandEdit, "not signed") ||
		!strings.Contains(r.HandEditHeld, "memory.create_relations requires approval") {
		t.Errorf("after the hand edit: pod reports %q, gateway answers %q", r.HandEdit, r.HandEditHeld)
	}
	if !strings.Contains(r.Replay, "which this gateway already served: an older state was put back") ||
		!strings.Contains(r.ReplayHeld, "memory.create_relations requires approval") {
		t.Errorf("after the older rendering was put back: pod reports %q, gateway answers %q", r.Replay, r.ReplayHeld)
	}
	// 9. The ServiceAccount reads no other Secret.
	if !strings.Contains(r.Forbidden, "Forbidden") || !strings.Contains(r.Forbidden, "system:serviceaccount:"+demo.Namespace+":"+demo.Gateway+"-gateway") {
		t.Errorf("reading Secret committers as the gateway: %q", r.Forbidden)
	}
	// It patches no pod, only its pod's Lease (issue 17).
	if r.PatchPods != "no" || r.PatchOwnLease != "yes" {
		t.Errorf("kubectl auth can-i as the gateway: patch pods %q, patch its pod's Lease %q; want no, yes", r.PatchPods, r.PatchOwnLease)
	}

	// Nothing is left running, and the folder is gone.
	if len(r.PIDs) != 3 {
		t.Errorf("started processes %v, want the controller, the memory sidecar and the gateway", r.PIDs)
	}
	if r.ServerPID == 0 {
		t.Error("the demo did not find the server process the sidecar's bridge ran")
	}
	for _, pid := range []int{r.ServerPID, r.RestartedPID, r.BridgeStop.Child} {
		if err := syscall.Kill(pid, 0); pid != 0 && !errors.Is(err, syscall.ESRCH) {
			t.Errorf("the sidecar's server %d is still there after the demo: %v", pid, err)
		}
	}
	for _, pid := range r.PIDs {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d is still there after the demo: %v", pid, err)
		}
	}
	if _, err := os.Stat(r.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the demo folder %s is still there: %v", r.Dir, err)
	}
	for _, want := range []string{"$ kubectl apply -f gateway.yaml", "$ kubectl get reversiruns -n agents", "$ kubectl patch reversirun", "(as alice)", "== Summary"} {
		if !bytes.Contains([]byte(out.String()), []byte(want)) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
}
