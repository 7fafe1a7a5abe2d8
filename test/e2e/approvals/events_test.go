package approvals

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/gateway/kube"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// Issue 24, Kubernetes Events: a gateway whose queue records Events (kube.Options.Events, as
// `reversi gateway` in a ReversiGateway pod runs it, with the events rule of the gateway Role)
// records one ApprovalRequested (Normal, reporting controller reversi-gateway) on the request
// it creates, saying the tool, run, actor, reason, who may approve, until when and how; once
// alice and bob approve, the controller records ApprovalApproved on it. Those are the only
// approval events of the request.
func TestApprovalEventsInKubernetes(t *testing.T) {
	ns := setupNamespace(t, "events")
	for _, o := range []client.Object{
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gateway-events"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gateway-events"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "gateway-events"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: actor}}},
	} {
		if err := env.Client.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigOf(t, actor))
	if err != nil {
		t.Fatal(err)
	}
	kst, err := kube.New(t.Context(), store.NewMemory(nil), kube.Options{Config: cfg, Namespace: ns, Gateway: "agents", Replica: "a", ControllerKeys: ctlKey.Trust, Events: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kst.Close() })
	if _, err := kst.CreateRun(t.Context(), store.Run{ID: "run-ev", Actor: actor, Gateway: "agents"}); err != nil {
		t.Fatal(err)
	}
	expires := time.Now().Add(time.Hour).Truncate(time.Second).UTC()
	a, err := kst.CreateApproval(t.Context(), store.ApprovalRequest{Tool: "memory.delete_entities", ArgsDigest: "sha256:" + strings.Repeat("0f", 32),
		Run: "run-ev", Actor: actor, Reason: "memory.delete_entities is irreversible", Roles: []string{"finance"}, Quorum: 2, Expires: expires})
	if err != nil {
		t.Fatal(err)
	}
	requested := fmt.Sprintf("Normal ApprovalRequested reversi-gateway: memory.delete_entities (run run-ev, actor agent-7): held for approval (memory.delete_entities is irreversible); needs 2 approval(s) from members of finance until %s (kubectl apply an Approval, or reversi approve %s --apply)",
		expires.Format(time.RFC3339), a.ID)
	list := func() []string {
		var evs eventsv1.EventList
		if err := env.Client.List(t.Context(), &evs, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range evs.Items {
			if e.Regarding.Kind == "ApprovalRequest" && e.Regarding.Name == a.ID && strings.HasPrefix(e.Reason, "Approval") {
				out = append(out, e.Type+" "+e.Reason+" "+e.ReportingController+": "+e.Note)
			}
		}
		slices.Sort(out)
		return out
	}
	waitFor(t, 10*time.Second, func() string {
		if got := list(); !slices.Equal(got, []string{requested}) {
			return fmt.Sprintf("events of %s:\n%q\nwant\n%q", a.ID, got, requested)
		}
		return ""
	})

	for _, who := range []string{"alice", "bob"} {
		if out, err := kubectl(t, who, approvalYAML(ns, a.ID+"-"+who, a.ID, "Approve"), "apply", "-f", "-"); err != nil {
			t.Fatalf("kubectl apply by %s: %v\n%s", who, err, out)
		}
	}
	want := []string{
		"Normal ApprovalApproved reversi-controller: memory.delete_entities (run run-ev, actor agent-7): approved by alice, bob (quorum 2); the gateway lets the call's retry through once",
		requested,
	}
	waitFor(t, 20*time.Second, func() string {
		if got := list(); !slices.Equal(got, want) {
			return fmt.Sprintf("events of %s:\n%q\nwant\n%q", a.ID, got, want)
		}
		return ""
	})
	time.Sleep(500 * time.Millisecond) // and no more
	if got := list(); !slices.Equal(got, want) {
		t.Errorf("events of %s:\n%q\nwant\n%q", a.ID, got, want)
	}
}

// Issue 24, notifications in Kubernetes mode: the gateway's store (under the Kubernetes queue)
// writes the outbox rows of a request kept as an ApprovalRequest: approval.requested when the
// gateway creates it, and approval.approved, in the transaction of the decision record the
// queue journals when it reads the controller's signed Approved phase, naming alice and bob
// (the run's counted approvers). A receiver whose tool filter excludes the tool gets no row.
// A second look at the same phase (a restart's informer) writes nothing more.
func TestKubernetesDecisionsReachTheOutbox(t *testing.T) {
	ns := setupNamespace(t, "outbox")
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigOf(t, actor))
	if err != nil {
		t.Fatal(err)
	}
	inner := store.NewMemory(nil)
	if err := inner.SetNotificationReceivers(t.Context(), []store.Receiver{{Name: "hook"}, {Name: "payments-only", Tools: []string{"payments.*"}}}); err != nil {
		t.Fatal(err)
	}
	kst, err := kube.New(t.Context(), inner, kube.Options{Config: cfg, Namespace: ns, Gateway: "agents", Replica: "a", ControllerKeys: ctlKey.Trust})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kst.Close() })
	if _, err := kst.CreateRun(t.Context(), store.Run{ID: "run-ob", Actor: actor, Gateway: "agents"}); err != nil {
		t.Fatal(err)
	}
	a, err := kst.CreateApproval(t.Context(), store.ApprovalRequest{Tool: "memory.delete_entities", ArgsDigest: "sha256:" + strings.Repeat("0f", 32),
		ArgsPreview: `{"entityNames":["a","[redacted]"]}`, Run: "run-ob", Actor: actor, Roles: []string{"finance"}, Quorum: 2, Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	rows := func() []string {
		l, err := inner.ListNotifications(t.Context(), store.NotificationFilter{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, n := range l {
			out = append(out, fmt.Sprintf("%s %s %s kept=%v by=%v preview=%s", n.Sink, n.Notice.Key, n.Notice.Tool, n.Notice.Kept, n.Notice.DecidedBy, n.Notice.ArgumentsPreview))
		}
		return out
	}
	requested := fmt.Sprintf(`hook approval.requested:%s memory.delete_entities kept=true by=[] preview={"entityNames":["a","[redacted]"]}`, a.ID)
	if got := rows(); !slices.Equal(got, []string{requested}) {
		t.Fatalf("outbox after the hold:\n%q\nwant\n%q", got, requested)
	}
	for _, who := range []string{"alice", "bob"} {
		if out, err := kubectl(t, who, approvalYAML(ns, a.ID+"-"+who, a.ID, "Approve"), "apply", "-f", "-"); err != nil {
			t.Fatalf("kubectl apply by %s: %v\n%s", who, err, out)
		}
	}
	want := []string{requested, fmt.Sprintf(`hook approval.approved:%s memory.delete_entities kept=true by=[alice bob] preview={"entityNames":["a","[redacted]"]}`, a.ID)}
	waitFor(t, 20*time.Second, func() string {
		if got := rows(); !slices.Equal(got, want) {
			return fmt.Sprintf("outbox:\n%q\nwant\n%q", got, want)
		}
		return ""
	})
	// Another process's queue on the same store reads the same phase: its journal finds the
	// record there (Once) and writes no second row.
	again, err := kube.New(t.Context(), inner, kube.Options{Config: cfg, Namespace: ns, Gateway: "agents", Replica: "b", ControllerKeys: ctlKey.Trust})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = again.Close() }) // it closes inner too, as kst does; the second Close is a no-op
	time.Sleep(time.Second)
	if got := rows(); !slices.Equal(got, want) {
		t.Errorf("outbox after a second queue read the request:\n%q\nwant\n%q", got, want)
	}
}
