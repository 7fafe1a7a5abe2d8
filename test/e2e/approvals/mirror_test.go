package approvals

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/kube"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// The decisions the controller makes on a gateway's request reach the run's ReversiRun as
// steps (outcome approval, with the approver and decision), without any call of the agent:
// the ApprovalRequest informer journals them and the run mirror writes them. Source: issue 16
// ("Decisions are ledger records ... and the ReversiRun mirror's step list").
func TestDecisionsReachTheReversiRun(t *testing.T) {
	ns := setupNamespace(t, "mirror")
	for _, o := range []client.Object{
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "runs"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"reversi.dev"}, Resources: []string{"reversiruns"}, Verbs: []string{"get", "list", "watch", "create", "update"}},
			{APIGroups: []string{"reversi.dev"}, Resources: []string{"reversiruns/status"}, Verbs: []string{"update"}},
		}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "runs"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "runs"},
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
	kst, err := kube.New(t.Context(), store.NewMemory(nil), kube.Options{Config: cfg, Namespace: ns, Gateway: "agents", Replica: "a", ControllerKeys: ctlKey.Trust})
	if err != nil {
		t.Fatal(err)
	}
	runs, err := kube.NewRuns(t.Context(), kst, kube.RunsOptions{Config: cfg, Namespace: ns, Gateway: "agents", Replica: "a", Interval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = runs.Close() })
	if _, err := runs.CreateRun(t.Context(), store.Run{ID: "run-m", Actor: actor, Gateway: "agents"}); err != nil {
		t.Fatal(err)
	}
	a, err := runs.CreateApproval(t.Context(), store.ApprovalRequest{Tool: "memory.delete_entities", ArgsDigest: "sha256:" + strings.Repeat("0f", 32),
		Run: "run-m", Actor: actor, Roles: []string{"finance"}, Quorum: 2, Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	for _, who := range []string{"alice", "bob"} {
		if out, err := kubectl(t, who, approvalYAML(ns, a.ID+"-"+who, a.ID, "Approve"), "apply", "-f", "-"); err != nil {
			t.Fatalf("kubectl apply by %s: %v\n%s", who, err, out)
		}
	}
	waitFor(t, 20*time.Second, func() string {
		r := &v1alpha1.ReversiRun{}
		if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "run-m"}, r); err != nil {
			return err.Error()
		}
		var got []string
		for _, s := range r.Status.Steps {
			if s.Outcome == "approval" && s.Approval != nil && s.ApprovalRequest == a.ID {
				got = append(got, s.Approval.Event+":"+s.Approval.Approver+":"+s.Approval.Decision)
			}
		}
		if g := strings.Join(got, ","); g != "requested::,counted:alice:Approve,counted:bob:Approve,approved::" {
			return fmt.Sprintf("steps %s", g)
		}
		return ""
	})
}

// slowRecords is a store whose CreateApproval takes longer than kube.IgnoreGrace: a loaded
// machine between the gateway's create of an ApprovalRequest and its record of it (the one
// fault a real store does not produce on demand).
type slowRecords struct{ store.Store }

func (s slowRecords) CreateApproval(ctx context.Context, req store.ApprovalRequest) (store.Approval, error) {
	time.Sleep(kube.IgnoreGrace + time.Second)
	return s.Store.CreateApproval(ctx, req)
}

// TestSlowRecordIsNotIgnored: a request this gateway is still recording is not journaled as
// another's ("ignored"), however long the record takes (the flake of make test on 2 loaded
// cores: the informer saw the object, the grace ran out, the record came after).
func TestSlowRecordIsNotIgnored(t *testing.T) {
	ns := setupNamespace(t, "slow")
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigOf(t, actor))
	if err != nil {
		t.Fatal(err)
	}
	kst, err := kube.New(t.Context(), slowRecords{store.NewMemory(nil)}, kube.Options{Config: cfg, Namespace: ns, Gateway: "agents", Replica: "a", ControllerKeys: ctlKey.Trust})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kst.Close() })
	run, err := kst.CreateRun(t.Context(), store.Run{Actor: actor, Gateway: "agents"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := kst.CreateApproval(t.Context(), store.ApprovalRequest{Tool: "memory.delete_entities", ArgsDigest: "sha256:" + strings.Repeat("0f", 32),
		Run: run.ID, Actor: actor, Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the informer's look after the record
	recs, err := kst.Records(t.Context(), run.ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	for _, r := range recs {
		if r.Kind == store.KindApproval && r.Approval == a.ID {
			events = append(events, string(r.Event)+": "+r.Note)
		}
	}
	if len(events) != 1 || !strings.HasPrefix(events[0], "requested") {
		t.Errorf("decision records of %s: %q, want only requested", a.ID, events)
	}
}
