package kubegateway

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/internal/cli"
)

// delivery is one POST a receiver got: when, its headers and its raw body.
type delivery struct {
	at     time.Time
	header http.Header
	body   []byte
}

// receiver is a real HTTP receiver on 127.0.0.1 that answers every POST with status and
// records it.
type receiver struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []delivery
}

func newReceiver(t *testing.T, status int) *receiver {
	r := &receiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(req.Body, 1<<20))
		r.mu.Lock()
		r.got = append(r.got, delivery{at: time.Now(), header: req.Header.Clone(), body: body})
		r.mu.Unlock()
		w.WriteHeader(status)
		if status >= 400 {
			_, _ = io.WriteString(w, "this receiver refuses everything")
		}
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// of returns the deliveries of one event type.
func (r *receiver) of(event string) []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []delivery
	for _, d := range r.got {
		if d.header.Get("X-Reversi-Event") == event {
			out = append(out, d)
		}
	}
	return out
}

// approvalManifests are memoryManifests with memory.delete_entities held for one approval of
// a member of finance, its second entity name redacted from the preview.
var approvalManifests = strings.Replace(memoryManifests, "  effect: irreversible\n  permission: memory:write\n",
	"  effect: irreversible\n  permission: memory:write\n  approval: {roles: [finance], quorum: 1, timeout: 10m}\n  audit: {redaction: [$args.entityNames.1]}\n", 1)

var heldRequest = regexp.MustCompile(`request (apr-[0-9a-f]+) is waiting`)

// TestNotificationsInKubernetes is issue 24's acceptance in Kubernetes mode: a ReversiGateway
// whose spec.notifications name two receivers on 127.0.0.1 through Secrets (URL and HMAC
// key), the controller's rendering, and `reversi gateway` run from the rendered pod spec with
// that env. A held call produces exactly one approval.requested delivery within 1 s, signed
// with the Secret's key, with the redacted preview and never the redacted value; the
// ApprovalRequested Event is on the request; an Approval applied with kubectl produces
// approval.approved. The second receiver answers 400 (permanent: dead at once); the pod
// reports the dead letter on its Lease and the ReversiGateway's NotificationsDelivered
// condition turns False saying so, without its URL, while Ready stays True.
func TestNotificationsInKubernetes(t *testing.T) {
	hook, broken := newReceiver(t, http.StatusNoContent), newReceiver(t, http.StatusBadRequest)
	hookURL, brokenURL := hook.srv.URL+"/hooks/s3cr3t-path", broken.srv.URL+"/hooks/br0ken-path"
	const key = "hmac-key-from-a-secret"
	w := startWorldWith(t, worldOptions{manifests: approvalManifests,
		secrets: map[string]map[string][]byte{
			"hooks":     {"url": []byte(hookURL), "broken": []byte(brokenURL)},
			"hook-hmac": {"key": []byte(key)},
		},
		notifications: []v1alpha1.GatewayNotification{
			{Name: "approvers-hook", Type: v1alpha1.NotificationWebhook, URLSecretRef: v1alpha1.SecretKeyReference{Name: "hooks", Key: "url"},
				SecretRef: &v1alpha1.SecretKeyReference{Name: "hook-hmac", Key: "key"}},
			{Name: "broken-hook", Type: v1alpha1.NotificationWebhook, URLSecretRef: v1alpha1.SecretKeyReference{Name: "hooks", Key: "broken"},
				Events: []string{"approval.requested"}},
		}})
	k8s, ctx, ns, must := w.k8s, w.ctx, w.ns, w.must
	began := time.Now()

	// Before any event: the pod reports an empty outbox.
	eventually(t, 10*time.Second, func() string {
		c := findCondition(w.gwStatus().Status.Conditions, v1alpha1.ConditionNotificationsDelivered)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonNoDeadLetters {
			return fmt.Sprintf("NotificationsDelivered %+v (Lease %v), want True NoDeadLetters", c, w.annotations())
		}
		return ""
	})

	// The held call.
	const hidden = "card-4111-1111-secret"
	started := time.Now()
	res, err := w.cs.CallTool(ctx, &mcp.CallToolParams{Name: "memory.delete_entities", Arguments: map[string]any{"entityNames": []any{"ada", hidden}}})
	must(err)
	returned := time.Now()
	m := heldRequest.FindStringSubmatch(text(res))
	if !res.IsError || m == nil {
		t.Fatalf("memory.delete_entities: %s, want it held for approval", text(res))
	}
	id := m[1]
	eventually(t, 5*time.Second, func() string {
		if n := len(hook.of("approval.requested")); n == 0 {
			return "no approval.requested delivery"
		}
		return ""
	})
	req := hook.of("approval.requested")[0]
	var body struct {
		Type       string    `json:"type"`
		Key        string    `json:"idempotency_key"`
		OccurredAt time.Time `json:"occurred_at"`
		Approval   string    `json:"approval_id"`
		Tool       string    `json:"tool"`
		Gateway    string    `json:"gateway"`
		Preview    string    `json:"arguments_preview"`
		Roles      []string  `json:"roles"`
		Quorum     int       `json:"quorum"`
		DecidedBy  []string  `json:"decided_by"`
	}
	must(json.Unmarshal(req.body, &body))
	t.Logf("approval.requested delivered %s after the call began, %s after it returned held, %s after the hold was committed",
		req.at.Sub(started).Round(time.Millisecond), req.at.Sub(returned).Round(time.Millisecond), req.at.Sub(body.OccurredAt).Round(time.Millisecond))
	if d := req.at.Sub(body.OccurredAt); d > time.Second || req.at.Sub(returned) > time.Second {
		t.Errorf("approval.requested arrived %s after the hold (%s after the call returned), want within 1 s", d, req.at.Sub(returned))
	}
	mac := hmac.New(sha256.New, []byte(key))
	mac.Write(req.body)
	if got, want := req.header.Get("X-Reversi-Signature"), "sha256="+hex.EncodeToString(mac.Sum(nil)); !hmac.Equal([]byte(got), []byte(want)) {
		t.Errorf("X-Reversi-Signature %q does not verify with the Secret's key (want %q)", got, want)
	}
	if want := `{"entityNames":["ada","[redacted]"]}`; body.Preview != want || body.Type != "approval.requested" || body.Approval != id ||
		body.Key != "approval.requested:"+id || body.Tool != "memory.delete_entities" || body.Gateway != "pay" || body.Quorum != 1 ||
		len(body.Roles) != 1 || body.Roles[0] != "finance" || req.header.Get("Idempotency-Key") != body.Key {
		t.Errorf("approval.requested body %s (headers %v), want request %s with preview %s", req.body, req.header, id, want)
	}
	if strings.Contains(string(req.body), hidden) {
		t.Errorf("ATTACK: the redacted argument is in the body: %s", req.body)
	}

	// The gateway's Event on the request.
	eventually(t, 10*time.Second, func() string {
		var evs eventsv1.EventList
		must(k8s.List(ctx, &evs, client.InNamespace(ns)))
		for _, e := range evs.Items {
			if e.Regarding.Kind == "ApprovalRequest" && e.Regarding.Name == id && e.Reason == "ApprovalRequested" && e.ReportingController == "reversi-gateway" {
				return ""
			}
		}
		return "no ApprovalRequested Event on " + id
	})

	// alice (finance) approves with kubectl apply; the hook hears approval.approved.
	users := t.TempDir()
	must(k8s.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "approver"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"reversi.dev"}, Resources: []string{"approvalrequests"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"reversi.dev"}, Resources: []string{"approvals"}, Verbs: []string{"get", "list", "watch", "create"}},
	}}))
	must(k8s.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "approvers"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "approver"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "finance"}}}))
	alice, err := w.env.UserKubeconfig(users, "alice", "finance")
	must(err)
	approval := fmt.Sprintf("apiVersion: reversi.dev/v1alpha1\nkind: Approval\nmetadata: {name: %s-alice, namespace: %s}\nspec:\n  requestRef: {name: %s}\n  decision: Approve\n", id, ns, id)
	cmd := exec.Command(w.env.Kubectl(), "--kubeconfig", alice, "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(approval)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply by alice: %v\n%s", err, out)
	}
	approvedAt := time.Now()
	eventually(t, 15*time.Second, func() string {
		if n := len(hook.of("approval.approved")); n == 0 {
			return "no approval.approved delivery"
		}
		return ""
	})
	ok := hook.of("approval.approved")[0]
	t.Logf("approval.approved delivered %s after kubectl apply", ok.at.Sub(approvedAt).Round(time.Millisecond))
	body.DecidedBy = nil
	must(json.Unmarshal(ok.body, &body))
	mac = hmac.New(sha256.New, []byte(key))
	mac.Write(ok.body)
	if ok.header.Get("X-Reversi-Signature") != "sha256="+hex.EncodeToString(mac.Sum(nil)) || body.Type != "approval.approved" || body.Approval != id ||
		len(body.DecidedBy) != 1 || body.DecidedBy[0] != "alice" || strings.Contains(string(ok.body), hidden) {
		t.Errorf("approval.approved %s (signature %q), want request %s decided by alice, signed, redacted", ok.body, ok.header.Get("X-Reversi-Signature"), id)
	}

	// The receiver that refuses: one attempt (400 is permanent), a dead letter, the condition.
	var cond *metav1.Condition
	eventually(t, 15*time.Second, func() string {
		gw := w.gwStatus()
		cond = findCondition(gw.Status.Conditions, v1alpha1.ConditionNotificationsDelivered)
		if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != v1alpha1.ReasonNotificationDeadLettered || cond.ObservedGeneration != gw.Generation {
			return fmt.Sprintf("NotificationsDelivered %+v (Lease %v), want False NotificationDeadLettered", cond, w.annotations())
		}
		return ""
	})
	t.Logf("NotificationsDelivered: %s", cond.Message)
	for _, want := range []string{"pod pay-gateway-0: 1 notification dead-lettered", `last: "broken-hook: HTTP 400: this receiver refuses everything`,
		"approval.requested:" + id, "kubectl exec -n agents pay-gateway-0 -c gateway -- /reversi notifications list --state dead --data /var/lib/reversi"} {
		if !strings.Contains(cond.Message, want) {
			t.Errorf("NotificationsDelivered message %q, want %q in it", cond.Message, want)
		}
	}
	for _, secret := range []string{"br0ken-path", "s3cr3t-path", broken.srv.URL, key} {
		if strings.Contains(cond.Message, secret) {
			t.Errorf("ATTACK: the condition holds %q: %s", secret, cond.Message)
		}
	}
	if c := apimetaReady(w.gwStatus()); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Ready %+v with a dead letter, want True (it is about serving)", c)
	}
	if a := w.annotations(); a[v1alpha1.AnnotationNotificationsDead] != "1" || a[v1alpha1.AnnotationNotificationsRetrying] != "0" {
		t.Errorf("the pod's Lease reports %v, want 1 dead, 0 retrying", a)
	}
	if n := len(broken.of("approval.requested")); n != 1 {
		t.Errorf("the refusing receiver got %d attempts, want 1 (400 is permanent)", n)
	}
	if n := len(hook.of("approval.requested")); n != 1 {
		t.Errorf("%d approval.requested deliveries to the hook, want exactly 1", n)
	}
	// The command the condition gives lists the dead letter (the pod's /var/lib/reversi is
	// the gateway's --data here), also while the gateway runs.
	var out, errb bytes.Buffer
	if code := cli.Execute([]string{"notifications", "list", "--state", "dead", "--data", w.dataDir}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "broken-hook") || !strings.Contains(out.String(), id) || strings.Contains(out.String(), "approvers-hook") {
		t.Errorf("reversi notifications list --state dead: %d\n%s%s", code, out.String(), errb.String())
	}
	t.Logf("from the world's start to here: %s", time.Since(began).Round(time.Millisecond))
}
