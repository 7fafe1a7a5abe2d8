package notify

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/gateway/store"
)

// goldenAlerts are the alerts of the golden files, one per gateway alert type.
var goldenAlerts = map[string]store.Notice{
	"reload-refused": {Type: store.NoticeAlertReloadRefused, Key: "alert.reload_refused:gw-a:12", At: goldenNotice.At, Seq: 12,
		Object: &store.ObjectRef{Kind: store.ObjectGateway, Name: "gw-a"}, Severity: store.SeverityWarning, Reason: "ReloadRefused",
		Revision: "sha256:4f2c", Message: "the gateway refused to reload its manifests: payments.yaml: signature does not verify <key k1>; the previous manifests (sha256:4f2c) and policy keep serving"},
	"rollback-failed": {Type: store.NoticeAlertRollbackFailed, Key: "alert.rollback_failed:agents/run-42:3:17", At: goldenNotice.At, Seq: 17,
		Namespace: "agents", Object: &store.ObjectRef{Kind: "ReversiRun", Namespace: "agents", Name: "run-42"}, Run: "run-42", Actor: "agent-alice",
		Tool: "payments.refund", Risk: store.Risk{BlastRadius: "high"}, Step: 3, Status: "verification_failed", Severity: store.SeverityCritical,
		Reason: "VerificationFailed", Message: "step 3 (payments.refund) of run run-42 was not rolled back: its compensation ran but the read-back never matched (first mismatch: $.total)"},
	"halted": {Type: store.NoticeAlertHalted, Key: "alert.halted:gw-a:20", At: goldenNotice.At, Seq: 20,
		Object: &store.ObjectRef{Kind: store.ObjectGateway, Name: "gw-a"}, Actor: "adam", Severity: store.SeverityCritical, Reason: "Halted",
		Since: goldenNotice.At, Revision: "sha256:4f2c", Message: "the kill switch is on: adam halted the gateway (incident 42 & co); every upstream call is blocked until an admin calls reversi.resume"},
	"resumed": {Type: store.NoticeAlertResumed, Key: "alert.resumed:gw-a:21", At: goldenNotice.At.Add(5 * time.Minute), Seq: 21,
		Object: &store.ObjectRef{Kind: store.ObjectGateway, Name: "gw-a"}, Actor: "adam", Severity: store.SeverityWarning, Reason: "Resumed",
		Since: goldenNotice.At, Revision: "sha256:4f2c", Message: "the kill switch is off: adam resumed the gateway, halted by adam since 2026-03-01T12:00:00Z (incident 42, 5m0s ago); upstream calls run again"},
	"upstream-down": {Type: store.NoticeAlertUpstreamDown, Key: "alert.upstream_down:gw-a:30", At: goldenNotice.At, Seq: 30,
		Object: &store.ObjectRef{Kind: store.ObjectGateway, Name: "gw-a"}, Upstream: "memory", Severity: store.SeverityCritical, Reason: "UpstreamDown",
		Since: goldenNotice.At.Add(-time.Hour), Revision: "sha256:4f2c", Message: "upstream memory went down at 2026-03-01T12:00:00Z after 1h0m0s up: the upstream process exited (signal: killed)"},
}

// TestAlertGolden: the Slack text of each gateway alert type (testdata/slack-alert-*.json)
// and the webhook body of a rollback step's and a refused reload's (webhook-alert-*.json):
// what happened, on which gateway, to which object, run or upstream, and what to do; go
// test -update rewrites them. Source: issue 24.
func TestAlertGolden(t *testing.T) {
	for name, n := range goldenAlerts {
		golden(t, "slack-alert-"+name+".json", func() ([]byte, error) { return SlackBody(n, "gw-a", "--data .reversi") })
	}
	kube := goldenAlerts["reload-refused"]
	kube.Namespace, kube.Object = "agents", &store.ObjectRef{Kind: "ReversiGateway", Namespace: "agents", Name: "gw-a"}
	kube.Key = "alert.reload_refused:agents/gw-a:12"
	golden(t, "slack-alert-reload-refused-kube.json", func() ([]byte, error) { return SlackBody(kube, "gw-a", "") })
	for _, name := range []string{"rollback-failed", "reload-refused"} {
		golden(t, "webhook-alert-"+name+".json", func() ([]byte, error) { return WebhookBody(goldenAlerts[name], "gw-a", "--data .reversi") })
	}
}

// TestAlertBodies: an alert's webhook body is schema_version 1 with the alert's fields and no
// approval fields or commands; its Slack text says what to do for each type.
func TestAlertBodies(t *testing.T) {
	for name, n := range goldenAlerts {
		b, err := WebhookBody(n, "gw-a", "--data .reversi")
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"approval_id", "approve_command", "deny_command", "arguments_preview", "quorum", "roles"} {
			if _, ok := m[k]; ok {
				t.Errorf("%s: the alert body has %s: %s", name, k, b)
			}
		}
		if m["schema_version"] != float64(1) || m["type"] != n.Type || m["idempotency_key"] != n.Key || m["severity"] != n.Severity ||
			m["reason"] != n.Reason || m["message"] != n.Message || m["action"] == "" || m["object"].(map[string]any)["name"] == "" {
			t.Errorf("%s: body %s", name, b)
		}
		s, err := SlackBody(n, "gw-a", "--data .reversi")
		if err != nil {
			t.Fatal(err)
		}
		var text struct{ Text string }
		if err := json.Unmarshal(s, &text); err != nil {
			t.Fatal(err)
		}
		for _, want := range map[string][]string{
			"reload-refused":  {"Reload refused", "previous manifests keep serving", "reversi validate", "reversi.reload"},
			"rollback-failed": {"step 3", "run-42", "kubectl get reversirun run-42 -n agents"},
			"halted":          {"by adam", "reversi.resume", "incident 42 &amp; co"},
			"resumed":         {"by adam", "run again"},
			"upstream-down":   {"upstream `memory`", "signal: killed", "reconnects by itself"},
		}[name] {
			if !strings.Contains(text.Text, want) {
				t.Errorf("%s: Slack text lacks %q:\n%s", name, want, text.Text)
			}
		}
	}
}
