package argocd

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// health is what a script returned: hs.status and hs.message.
type health struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

// runHealth runs script the way Argo CD runs a resource.customizations.health script from
// argocd-cm: gopher-lua without the open libraries (only base, table and package; Argo CD adds
// a restricted os, which these scripts do not use), a one-second deadline, the object as the
// global `obj`, and the table the chunk returns read as {status, message}. A status outside
// Argo CD's set (Healthy, Progressing, Degraded, Suspended, Missing) is an error here (Argo
// CD would show Unknown).
func runHealth(t *testing.T, script string, obj map[string]any) health {
	t.Helper()
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for name, open := range map[string]lua.LGFunction{lua.LoadLibName: lua.OpenPackage, lua.BaseLibName: lua.OpenBase, lua.TabLibName: lua.OpenTable} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(open), NRet: 0, Protect: true}, lua.LString(name)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", toLua(l, obj))
	if err := l.DoString(script); err != nil {
		t.Fatalf("script failed: %v", err)
	}
	tbl, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		t.Fatalf("script returned %s, not a table", l.Get(-1).Type())
	}
	var h health
	if s, ok := tbl.RawGetString("status").(lua.LString); ok {
		h.Status = string(s)
	}
	if s, ok := tbl.RawGetString("message").(lua.LString); ok {
		h.Message = string(s)
	}
	switch h.Status {
	case "Healthy", "Progressing", "Degraded", "Suspended", "Missing":
	default:
		t.Fatalf("hs.status %q is not an Argo CD health status (message %q)", h.Status, h.Message)
	}
	return h
}

// toLua converts an unstructured value as Argo CD does: maps to tables with string keys,
// lists to arrays, numbers (int64 from the converter, float64 from JSON) to LNumber.
func toLua(l *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(v)
	case string:
		return lua.LString(v)
	case int64:
		return lua.LNumber(v)
	case int32:
		return lua.LNumber(v)
	case int:
		return lua.LNumber(v)
	case float64:
		return lua.LNumber(v)
	case json.Number:
		return lua.LString(v)
	case []any:
		t := l.CreateTable(len(v), 0)
		for _, e := range v {
			t.Append(toLua(l, e))
		}
		return t
	case map[string]any:
		t := l.CreateTable(0, len(v))
		for k, e := range v {
			t.RawSetString(k, toLua(l, e))
		}
		return t
	}
	panic(fmt.Sprintf("unexpected %T in an unstructured object", v))
}

// unstructuredOf converts a typed object to its unstructured form (what Argo CD holds).
func unstructuredOf(t *testing.T, o runtime.Object) map[string]any {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

const gen = 3

func objMeta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: "agents", Generation: gen}
}

// set applies the conditions to conds with meta.SetStatusCondition, each observing gen.
func set(conds *[]metav1.Condition, cs ...metav1.Condition) {
	for _, c := range cs {
		c.ObservedGeneration = gen
		meta.SetStatusCondition(conds, c)
	}
}

func ready(status metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: v1alpha1.ConditionReady, Status: status, Reason: reason, Message: msg}
}

func stalled(reason, msg string) metav1.Condition {
	return metav1.Condition{Type: v1alpha1.ConditionStalled, Status: metav1.ConditionTrue, Reason: reason, Message: msg}
}

func reconciling(reason, msg string) metav1.Condition {
	return metav1.Condition{Type: v1alpha1.ConditionReconciling, Status: metav1.ConditionTrue, Reason: reason, Message: msg}
}

func cond(typ string, status metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg}
}

type healthCase struct {
	name   string
	obj    runtime.Object
	status string
	// message holds the fragments hs.message must contain.
	message []string
}

// Each kind's objects are built as typed api/v1alpha1 objects in the states its controller
// (or, for ReversiRun, the gateway) writes, and the script must map each to the Argo CD health
// an Argo user expects (docs/argocd.md, "What Healthy means").
func TestHealthChecks(t *testing.T) {
	cases := map[string][]healthCase{
		"ManifestRegistry": registryCases(),
		"ToolManifest":     toolManifestCases(),
		"ReversiGateway":   gatewayCases(),
		"ApprovalRequest":  requestCases(),
		"Approval":         approvalCases(),
		"ReversiRun":       runCases(),
	}
	for _, kind := range Kinds {
		script, err := HealthScript(kind)
		if err != nil {
			t.Fatal(err)
		}
		if len(cases[kind]) == 0 {
			t.Fatalf("no cases for %s", kind)
		}
		for _, c := range cases[kind] {
			t.Run(kind+"/"+c.name, func(t *testing.T) {
				got := runHealth(t, script, unstructuredOf(t, c.obj))
				if got.Status != c.status {
					t.Errorf("status %s (%q), want %s", got.Status, got.Message, c.status)
				}
				for _, f := range c.message {
					if !strings.Contains(got.Message, f) {
						t.Errorf("message %q lacks %q", got.Message, f)
					}
				}
			})
		}
	}
}

// commonCases are the kstatus states every kind shares: no status, a status of an older
// generation, Stalled, Reconciling and Ready=False. build returns a fresh object of the kind
// with its status conditions for the test to fill.
func commonCases(build func(observed int64, cs ...metav1.Condition) runtime.Object, waiting string) []healthCase {
	return []healthCase{
		{"no status", build(0), "Progressing", []string{waiting}},
		{"old observedGeneration", build(gen-1, ready(metav1.ConditionTrue, "Succeeded", "was fine")), "Progressing",
			[]string{"Waiting for generation 3 to be observed (status describes 2)"}},
		{"stalled", build(gen, ready(metav1.ConditionFalse, "InvalidSpec", "fix the spec"), stalled("InvalidSpec", "fix the spec")), "Degraded",
			[]string{"Stalled: InvalidSpec: fix the spec"}},
		{"reconciling", build(gen, ready(metav1.ConditionFalse, "Progressing", "working"), reconciling("Progressing", "working on it")), "Progressing",
			[]string{"Reconciling: Progressing: working on it"}},
		{"not ready", build(gen, ready(metav1.ConditionFalse, "SecretNotFound", "create Secret x")), "Degraded",
			[]string{"Ready: SecretNotFound: create Secret x"}},
	}
}

func registryCases() []healthCase {
	build := func(observed int64, cs ...metav1.Condition) *v1alpha1.ManifestRegistry {
		r := &v1alpha1.ManifestRegistry{ObjectMeta: objMeta("tools"), Spec: v1alpha1.ManifestRegistrySpec{URL: "https://git.example.com/tools.git"}}
		r.Status.ObservedGeneration = observed
		set(&r.Status.Conditions, cs...)
		return r
	}
	b := func(o int64, cs ...metav1.Condition) runtime.Object { return build(o, cs...) }
	rev := "main@sha1:0123456789abcdef0123456789abcdef01234567"
	healthy := build(gen, ready(metav1.ConditionTrue, "Succeeded", "stored 4 tools of "+rev),
		cond(v1alpha1.ConditionSourceVerified, metav1.ConditionTrue, "Verified", "ok"),
		cond(v1alpha1.ConditionArtifactInStorage, metav1.ConditionTrue, "Succeeded", "ok"))
	failedKeepsOld := build(gen, ready(metav1.ConditionFalse, v1alpha1.ReasonSignatureVerificationFailed, "tool x v2 is not signed"),
		cond(v1alpha1.ConditionArtifactInStorage, metav1.ConditionTrue, "Succeeded", "older revision"))
	failedKeepsOld.Status.Artifact = &v1alpha1.RegistryArtifact{Revision: rev, Digest: "sha256:" + strings.Repeat("a", 64), Tools: 4}
	suspended := build(gen, ready(metav1.ConditionTrue, v1alpha1.ReasonSuspended, "reconciliation is suspended"))
	suspended.Spec.Suspend = true
	suspendedUnseen := build(gen-1, ready(metav1.ConditionTrue, "Succeeded", "ok"))
	suspendedUnseen.Spec.Suspend = true
	return append(commonCases(b, "Waiting for the controller to fetch the repository"),
		healthCase{"ready", healthy, "Healthy", []string{"stored 4 tools of " + rev}},
		healthCase{"new revision failed, old one served", failedKeepsOld, "Degraded",
			[]string{"Ready: SignatureVerificationFailed: tool x v2 is not signed", "(still serving " + rev + ")"}},
		healthCase{"suspended", suspended, "Suspended", []string{"set spec.suspend to false"}},
		healthCase{"suspend not seen yet", suspendedUnseen, "Progressing", []string{"Waiting for generation 3"}},
	)
}

func toolManifestCases() []healthCase {
	build := func(observed int64, cs ...metav1.Condition) *v1alpha1.ToolManifest {
		tm := &v1alpha1.ToolManifest{ObjectMeta: objMeta("refund")}
		tm.Status.ObservedGeneration = observed
		set(&tm.Status.Conditions, cs...)
		return tm
	}
	b := func(o int64, cs ...metav1.Condition) runtime.Object { return build(o, cs...) }
	valid := cond(v1alpha1.ConditionValid, metav1.ConditionTrue, "Succeeded", "refund v2 stable is valid")
	return append(commonCases(b, "Waiting for the controller to validate the manifest"),
		healthCase{"ready and signed", build(gen, valid, cond(v1alpha1.ConditionSignatureVerified, metav1.ConditionTrue, "Verified", "signed by key 01"),
			ready(metav1.ConditionTrue, "Succeeded", "valid and signed, checksum 0123abcd")), "Healthy", []string{"valid and signed"}},
		healthCase{"ready, no trusted keys", build(gen, valid, ready(metav1.ConditionTrue, "Succeeded", "valid; the signature is not checked")),
			"Healthy", []string{"the signature is not checked"}},
		healthCase{"edited without re-signing", build(gen, valid,
			cond(v1alpha1.ConditionSignatureVerified, metav1.ConditionFalse, v1alpha1.ReasonSignatureVerificationFailed, "the signature does not match the spec"),
			ready(metav1.ConditionFalse, v1alpha1.ReasonSignatureVerificationFailed, "the signature does not match the spec"),
			stalled(v1alpha1.ReasonSignatureVerificationFailed, "the signature does not match the spec")),
			"Degraded", []string{"SignatureVerified: SignatureVerificationFailed: the signature does not match the spec", "gateways do not enforce this manifest"}},
		healthCase{"unsigned", build(gen, valid,
			cond(v1alpha1.ConditionSignatureVerified, metav1.ConditionFalse, v1alpha1.ReasonSignatureMissing, "no reversi.dev/signature annotation"),
			ready(metav1.ConditionFalse, v1alpha1.ReasonSignatureMissing, "no reversi.dev/signature annotation")),
			"Degraded", []string{"SignatureVerified: SignatureMissing"}},
		healthCase{"invalid spec", build(gen, cond(v1alpha1.ConditionValid, metav1.ConditionFalse, v1alpha1.ReasonValidationFailed, "effect: must be one of"),
			ready(metav1.ConditionFalse, v1alpha1.ReasonValidationFailed, "effect: must be one of"), stalled(v1alpha1.ReasonValidationFailed, "effect: must be one of")),
			"Degraded", []string{"Valid: ValidationFailed: effect: must be one of"}},
	)
}

func gatewayCases() []healthCase {
	build := func(observed int64, cs ...metav1.Condition) *v1alpha1.ReversiGateway {
		gw := &v1alpha1.ReversiGateway{ObjectMeta: objMeta("gw")}
		gw.Status.ObservedGeneration = observed
		set(&gw.Status.Conditions, cs...)
		return gw
	}
	b := func(o int64, cs ...metav1.Condition) runtime.Object { return build(o, cs...) }
	loadFailed := build(gen, ready(metav1.ConditionFalse, "LoadFailed", "1 pod refuses the set"))
	loadFailed.Status.Manifests = &v1alpha1.GatewayManifestsStatus{LastLoadError: "snapshot older than served"}
	return append(commonCases(b, "Waiting for the controller to render the gateway"),
		healthCase{"ready", build(gen, ready(metav1.ConditionTrue, "Succeeded", "2/2 pods serve 4 tools")), "Healthy", []string{"2/2 pods serve 4 tools"}},
		healthCase{"rollout", build(gen, ready(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress, "1/2 pods loaded"),
			reconciling(v1alpha1.ReasonRolloutInProgress, "1/2 pods loaded")), "Progressing", []string{"RolloutInProgress: 1/2 pods loaded"}},
		healthCase{"load error", loadFailed, "Degraded", []string{"1 pod refuses the set", "(last load error: snapshot older than served)"}},
	)
}

func requestCases() []healthCase {
	build := func(observed int64, cs ...metav1.Condition) *v1alpha1.ApprovalRequest {
		ar := &v1alpha1.ApprovalRequest{ObjectMeta: objMeta("apr-7f3a")}
		ar.Status.ObservedGeneration = observed
		set(&ar.Status.Conditions, cs...)
		return ar
	}
	b := func(o int64, cs ...metav1.Condition) runtime.Object { return build(o, cs...) }
	phase := func(p, reason string, st metav1.ConditionStatus, msg string) *v1alpha1.ApprovalRequest {
		ar := build(gen, ready(st, reason, msg))
		ar.Status.Phase, ar.Status.Message = p, msg
		return ar
	}
	pending := phase(v1alpha1.ApprovalPending, v1alpha1.ReasonWaitingForApprovals, metav1.ConditionFalse, "0 of 1 approvals; waiting for members of finance")
	escalated := phase(v1alpha1.ApprovalEscalated, v1alpha1.ReasonWaitingForApprovals, metav1.ConditionFalse, "escalated: 0 of 1 approvals")
	unstamped := phase(v1alpha1.ApprovalPending, v1alpha1.ReasonApprovalNotStamped, metav1.ConditionFalse, "1 Approval(s) carry no valid stamp")
	approved := phase(v1alpha1.ApprovalApproved, v1alpha1.ReasonApproved, metav1.ConditionTrue, "approved by alice (quorum 1)")
	approved.Status.Decision = &v1alpha1.SignedDecision{}
	unsigned := phase(v1alpha1.ApprovalApproved, v1alpha1.ReasonApproved, metav1.ConditionTrue, "approved by mallory")
	denied := phase(v1alpha1.ApprovalDenied, v1alpha1.ReasonDenied, metav1.ConditionTrue, "denied by bob; the call stays blocked")
	expired := phase(v1alpha1.ApprovalExpired, v1alpha1.ReasonExpired, metav1.ConditionTrue, "expired at 2026-01-02T03:04:05Z with 0 of 1 approvals")
	notSealed := build(gen, ready(metav1.ConditionFalse, v1alpha1.ReasonStatusNotSealed, "the status carries no seal"),
		stalled(v1alpha1.ReasonStatusNotSealed, "the status carries no seal"))
	notSealed.Status.Phase = v1alpha1.ApprovalApproved
	return append(commonCases(b, "Waiting for the controller to count approvals"),
		healthCase{"pending", pending, "Suspended", []string{"Pending: 0 of 1 approvals; waiting for members of finance"}},
		healthCase{"escalated", escalated, "Suspended", []string{"Escalated: escalated: 0 of 1"}},
		healthCase{"approval not stamped", unstamped, "Degraded", []string{"Ready: ApprovalNotStamped: 1 Approval(s) carry no valid stamp"}},
		healthCase{"approved (ready)", approved, "Healthy", []string{"Approved: approved by alice"}},
		healthCase{"approved without signed decision", unsigned, "Degraded", []string{"status.decision", "keeps the call held"}},
		healthCase{"denied", denied, "Degraded", []string{"Denied: denied by bob"}},
		healthCase{"expired", expired, "Degraded", []string{"Expired: expired at 2026-01-02T03:04:05Z"}},
		healthCase{"status not sealed", notSealed, "Degraded", []string{"Stalled: StatusNotSealed"}},
	)
}

func approvalCases() []healthCase {
	build := func(observed int64, cs ...metav1.Condition) *v1alpha1.Approval {
		a := &v1alpha1.Approval{ObjectMeta: objMeta("apr-7f3a-alice")}
		a.Status.ObservedGeneration = observed
		set(&a.Status.Conditions, cs...)
		return a
	}
	b := func(o int64, cs ...metav1.Condition) runtime.Object { return build(o, cs...) }
	counted := build(gen, ready(metav1.ConditionTrue, v1alpha1.ReasonCounted, "counted towards request apr-7f3a"))
	counted.Status.Result, counted.Status.Message = v1alpha1.ResultCounted, "counted towards request apr-7f3a"
	rejected := build(gen, ready(metav1.ConditionTrue, v1alpha1.ReasonRejected, "the approver is the run's own actor"))
	rejected.Status.Result, rejected.Status.Message = v1alpha1.ResultRejected, "the approver is the run's own actor"
	noRequest := build(gen, ready(metav1.ConditionFalse, v1alpha1.ReasonRequestNotFound, "no ApprovalRequest apr-7f3a"))
	return append(commonCases(b, "Waiting for the controller to count the approval"),
		healthCase{"counted (ready)", counted, "Healthy", []string{"Counted: counted towards request apr-7f3a"}},
		healthCase{"rejected", rejected, "Degraded", []string{"Rejected: the approver is the run's own actor"}},
		healthCase{"request not found", noRequest, "Degraded", []string{"Ready: RequestNotFound: no ApprovalRequest apr-7f3a"}},
	)
}

func runCases() []healthCase {
	build := func(observed int64, cs ...metav1.Condition) *v1alpha1.ReversiRun {
		r := &v1alpha1.ReversiRun{ObjectMeta: objMeta("run-1")}
		r.Status.ObservedGeneration = observed
		set(&r.Status.Conditions, cs...)
		return r
	}
	b := func(o int64, cs ...metav1.Condition) runtime.Object { return build(o, cs...) }
	phase := func(p string, cs ...metav1.Condition) *v1alpha1.ReversiRun {
		r := build(0, cs...) // the gateway leaves status.observedGeneration unset: the Ready condition's counts
		r.Status.Phase = p
		return r
	}
	active := phase(v1alpha1.RunActive, ready(metav1.ConditionTrue, v1alpha1.RunActive, "a session is attached to the run"))
	idle := phase(v1alpha1.RunIdle, ready(metav1.ConditionTrue, v1alpha1.RunIdle, "no session is attached"))
	rollingBack := phase(v1alpha1.RunRollingBack, ready(metav1.ConditionFalse, v1alpha1.RunRollingBack, "rolling back"),
		reconciling("RollingBack", "the gateway replica gw-0 is running the compensations"))
	rolledBack := phase(v1alpha1.RunRolledBack, ready(metav1.ConditionTrue, v1alpha1.RunRolledBack, "every step is undone"))
	partial := phase(v1alpha1.RunPartiallyRolledBack, ready(metav1.ConditionFalse, "RollbackIncomplete", "some steps are not undone"))
	partial.Status.Rollback = &v1alpha1.RunRollbackStatus{Phase: v1alpha1.RollbackPartiallySucceeded, Message: "2 of 3 steps undone"}
	staleReady := phase(v1alpha1.RunIdle, ready(metav1.ConditionTrue, v1alpha1.RunIdle, "no session is attached"))
	staleReady.Generation = gen + 1 // spec.rollback was just set; the gateway has not answered
	return append(commonCases(b, "Waiting for the gateway to report the run"),
		healthCase{"active (ready)", active, "Healthy", []string{"Active: a session is attached"}},
		healthCase{"idle", idle, "Healthy", []string{"Idle: no session is attached"}},
		healthCase{"rolling back", rollingBack, "Progressing", []string{"RollingBack: the gateway replica gw-0 is running the compensations"}},
		healthCase{"rolled back", rolledBack, "Healthy", []string{"RolledBack: every step is undone"}},
		healthCase{"partially rolled back", partial, "Degraded",
			[]string{"PartiallyRolledBack: Ready: RollbackIncomplete: some steps are not undone", "(2 of 3 steps undone)"}},
		healthCase{"rollback asked, not answered", staleReady, "Progressing", []string{"Waiting for generation 4 to be observed (status describes 3)"}},
	)
}
