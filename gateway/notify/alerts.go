package notify

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/reversi-gitops/reversi/gateway/store"
)

// AlertBody is the generic webhook's JSON body of an alert (the alert.* types; Source: issue
// 24), schema_version 1 like Body. object, revision, reason, message and severity are the
// names of the controller's alert body; the rest say which run, step, tool, upstream or
// principal the alert is about (absent when it is about none). It has no approve or deny
// command: an alert asks for no decision. Action says what to do.
type AlertBody struct {
	SchemaVersion  int       `json:"schema_version"`
	Type           string    `json:"type"`
	IdempotencyKey string    `json:"idempotency_key"`
	OccurredAt     time.Time `json:"occurred_at"`
	Gateway        string    `json:"gateway,omitempty"`
	// Severity is "warning" or "critical".
	Severity string          `json:"severity"`
	Object   store.ObjectRef `json:"object"`
	// Reason is CamelCase (ReloadRefused, VerificationFailed, Unrecoverable, Halted, Resumed,
	// UpstreamDown); Message the sentence that explains it.
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// Revision is the checksum ("sha256:<hex>") of the manifests served when it happened.
	Revision string `json:"revision,omitempty"`
	// Run, Step, Status, Tool and Risk: a rollback step (alert.rollback_failed).
	Run    string      `json:"run,omitempty"`
	Step   int64       `json:"step,omitempty"`
	Status string      `json:"status,omitempty"`
	Tool   string      `json:"tool,omitempty"`
	Risk   *store.Risk `json:"risk,omitempty"`
	// Actor is who turned the kill switch (alert.halted, alert.resumed).
	Actor    string `json:"actor,omitempty"`
	Upstream string `json:"upstream,omitempty"`
	// Since is when the state began: halted since (alert.halted, alert.resumed), the session's
	// start (alert.upstream_down).
	Since *time.Time `json:"since,omitempty"`
	// JournalSeq is the Seq of the journal record the alert announces (the run's journal for
	// a rollback step, the gateway's otherwise).
	JournalSeq int64 `json:"journal_seq"`
	// Action is what to do about it.
	Action string `json:"action"`
}

// alertTitles are the first words of an alert's Slack message.
var alertTitles = map[string]string{
	store.NoticeAlertReloadRefused:    "Reload refused",
	store.NoticeAlertRenderingRefused: "Rendering refused",
	store.NoticeAlertRollbackFailed:   "Rollback step not undone",
	store.NoticeAlertHalted:           "Gateway halted (kill switch on)",
	store.NoticeAlertResumed:          "Gateway resumed (kill switch off)",
	store.NoticeAlertUpstreamDown:     "Upstream down",
}

// alertAction is what to do about alert n (storeFlags locate a standalone gateway's store).
func alertAction(n store.Notice, storeFlags string) string {
	kube := n.Namespace != ""
	switch n.Type {
	case store.NoticeAlertReloadRefused:
		if kube {
			return fmt.Sprintf("The previous manifests keep serving. The rendering the gateway read did not load: check its registries with `kubectl get manifestregistries -n %s` and the gateway's log; the gateway reloads when its ConfigMap changes.", n.Namespace)
		}
		return "The previous manifests keep serving. Fix the manifests (check them with `reversi validate PATH`, and a signed registry with `reversi manifests verify`), then reload with the reversi.reload tool or let the file watch pick the change up."
	case store.NoticeAlertRollbackFailed:
		if kube {
			return fmt.Sprintf("The step's change may still be in effect: check it and undo it by hand. `kubectl get reversirun %s -n %s -o yaml` shows the rollback steps.", n.Run, n.Namespace)
		}
		cmd := "reversi rollback " + n.Run
		if storeFlags != "" {
			cmd += " " + storeFlags
		}
		return fmt.Sprintf("The step's change may still be in effect: check it and undo it by hand. `%s` shows the run's rollback plan (a dry run).", cmd)
	case store.NoticeAlertHalted:
		return "Every upstream call is blocked. When it is safe, an admin resumes the gateway with the reversi.resume tool (operator endpoint)."
	case store.NoticeAlertResumed:
		return "Nothing: upstream calls run again."
	case store.NoticeAlertUpstreamDown:
		return fmt.Sprintf("Check the upstream %s (its process, URL or pod). The gateway reconnects by itself and journals it; calls to its tools are refused until then.", n.Upstream)
	}
	return ""
}

// alertWebhookBody renders alert n for the generic webhook.
func alertWebhookBody(n store.Notice, gateway, storeFlags string) ([]byte, error) {
	b := AlertBody{SchemaVersion: SchemaVersion, Type: n.Type, IdempotencyKey: n.Key, OccurredAt: n.At, Gateway: gateway,
		Severity: n.Severity, Reason: n.Reason, Message: n.Message, Revision: n.Revision, Run: n.Run, Step: n.Step,
		Status: n.Status, Tool: n.Tool, Actor: n.Actor, Upstream: n.Upstream, JournalSeq: n.Seq, Action: alertAction(n, storeFlags)}
	if n.Object != nil {
		b.Object = *n.Object
	}
	if n.Risk != (store.Risk{}) {
		r := n.Risk
		b.Risk = &r
	}
	if !n.Since.IsZero() {
		s := n.Since
		b.Since = &s
	}
	return json.Marshal(b)
}

// alertSlackBody renders alert n for Slack: one line saying what happened where, then the
// details (the message in a code block, the object, run, step, upstream, revision) and what to do.
func alertSlackBody(n store.Notice, gateway, storeFlags string) ([]byte, error) {
	e := slackEscape.Replace
	var b strings.Builder
	title := alertTitles[n.Type]
	if title == "" {
		title = n.Type
	}
	icon := ":warning:"
	if n.Severity == store.SeverityCritical {
		icon = ":rotating_light:"
	}
	fmt.Fprintf(&b, "%s *%s*", icon, title)
	if gateway != "" {
		fmt.Fprintf(&b, " on gateway %s", e(gateway))
	}
	if n.Namespace != "" {
		fmt.Fprintf(&b, " (namespace %s)", e(n.Namespace))
	}
	switch {
	case n.Type == store.NoticeAlertRollbackFailed:
		fmt.Fprintf(&b, ": step %d (`%s`) of run %s is %s", n.Step, e(n.Tool), e(n.Run), e(n.Status))
	case n.Upstream != "":
		fmt.Fprintf(&b, ": upstream `%s`", e(n.Upstream))
	case n.Actor != "":
		fmt.Fprintf(&b, " by %s", e(n.Actor))
	}
	fmt.Fprintf(&b, "\n*Severity:* %s   *Reason:* %s", e(n.Severity), e(n.Reason))
	if n.Message != "" {
		// In a code block: the message quotes text others chose (an upstream's read-back, a
		// file's error), which must not become mrkdwn (links, mentions, lines of its own).
		fmt.Fprintf(&b, "\n```%s```", e(strings.ReplaceAll(n.Message, "```", "` ` `")))
	}
	if n.Object != nil {
		fmt.Fprintf(&b, "\n*Object:* %s %s", e(n.Object.Kind), e(alertObject(*n.Object)))
	}
	if n.Type == store.NoticeAlertRollbackFailed {
		fmt.Fprintf(&b, "\n*Risk:* %s", e(riskText(n.Risk)))
	}
	if !n.Since.IsZero() {
		label := "Since"
		if n.Type == store.NoticeAlertUpstreamDown {
			label = "Up since"
		}
		fmt.Fprintf(&b, "\n*%s:* %s", label, n.Since.UTC().Format(time.RFC3339))
	}
	if n.Revision != "" {
		fmt.Fprintf(&b, "\n*Manifests served:* `%s`", e(n.Revision))
	}
	if a := alertAction(n, storeFlags); a != "" {
		fmt.Fprintf(&b, "\n*What to do:* %s", e(a))
	}
	return json.Marshal(map[string]string{"text": b.String()})
}

func alertObject(o store.ObjectRef) string {
	if o.Namespace != "" {
		return o.Namespace + "/" + o.Name
	}
	return o.Name
}
