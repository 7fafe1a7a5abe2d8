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
