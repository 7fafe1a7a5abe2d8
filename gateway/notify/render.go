package notify

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/reversi-gitops/reversi/gateway/store"
)

// SchemaVersion is the webhook body's schema_version: it grows when a field changes meaning
// or goes away (new fields may appear without it).
const SchemaVersion = 1

// Body is the generic webhook's JSON body. Its fields (and their JSON names) are the contract
// with receivers; see docs in the package comment.
type Body struct {
	SchemaVersion  int       `json:"schema_version"`
	Type           string    `json:"type"`
	IdempotencyKey string    `json:"idempotency_key"`
	OccurredAt     time.Time `json:"occurred_at"`
	Gateway        string    `json:"gateway,omitempty"`
	// Namespace is the Kubernetes namespace of the request (a gateway's name is unique only
	// in its namespace); absent for a standalone gateway.
	Namespace string `json:"namespace,omitempty"`
	Approval  string `json:"approval_id"`
	Tool      string `json:"tool"`
	Run       string `json:"run"`
	Actor     string `json:"actor"`
	Reason    string `json:"reason,omitempty"`
	// ArgumentsPreview is the redacted preview (JSON text, the manifest's audit.redaction
	// paths and secret-looking fields replaced by "[redacted]"), as ApprovalRequest's
	// spec.argumentsPreview: never the arguments.
	ArgumentsPreview string     `json:"arguments_preview"`
	Risk             store.Risk `json:"risk"`
	Roles            []string   `json:"roles"`
	Quorum           int        `json:"quorum"`
	ExpiresAt        *time.Time `json:"expires_at"`
	DecidedBy        []string   `json:"decided_by,omitempty"`
	Note             string     `json:"note,omitempty"`
	// ApproveCommand and DenyCommand decide the request (approval.requested and
	// approval.escalated only).
	ApproveCommand string `json:"approve_command,omitempty"`
	DenyCommand    string `json:"deny_command,omitempty"`
}

// Commands are the exact commands that decide request n: a request kept in Kubernetes is
// decided with an Approval object (`reversi approve ID --apply`); a standalone gateway's with
// `reversi approvals approve ID --by NAME` against its store (storeFlags, e.g. "--data
// .reversi", locate it).
func Commands(n store.Notice, storeFlags string) (approve, deny string) {
	if n.Kept {
		// the request's namespace, not the approver's kubeconfig's
		ns := ""
		if n.Namespace != "" {
			ns = " -n " + n.Namespace
		}
		return "reversi approve " + n.Approval + ns + " --apply", "reversi deny " + n.Approval + ns + " --apply"
	}
	tail := " --by <your name>"
	if storeFlags != "" {
		tail = " " + storeFlags + tail
	}
	return "reversi approvals approve " + n.Approval + tail, "reversi approvals deny " + n.Approval + tail
}

// decides reports whether a notice of this type asks for a decision.
func decides(typ string) bool {
	return typ == store.NoticeApprovalRequested || typ == store.NoticeApprovalEscalated
}

// WebhookBody renders n for the generic webhook: Body for an approval event, AlertBody for
// an alert (store.IsAlert).
func WebhookBody(n store.Notice, gateway, storeFlags string) ([]byte, error) {
	if store.IsAlert(n.Type) {
		return alertWebhookBody(n, gateway, storeFlags)
	}
	b := Body{SchemaVersion: SchemaVersion, Type: n.Type, IdempotencyKey: n.Key, OccurredAt: n.At, Gateway: gateway, Namespace: n.Namespace,
		Approval: n.Approval, Tool: n.Tool, Run: n.Run, Actor: n.Actor, Reason: n.Reason, ArgumentsPreview: n.ArgumentsPreview,
		Risk: n.Risk, Roles: n.Roles, Quorum: n.Quorum, DecidedBy: n.DecidedBy, Note: n.Note}
	if b.Roles == nil {
		b.Roles = []string{}
	}
	if !n.Expires.IsZero() {
		e := n.Expires
		b.ExpiresAt = &e
	}
	if decides(n.Type) {
		b.ApproveCommand, b.DenyCommand = Commands(n, storeFlags)
	}
	return json.Marshal(b)
}

// titles are the first words of a Slack message, by notice type.
var titles = map[string]string{
	store.NoticeApprovalRequested: "Approval requested",
	store.NoticeApprovalApproved:  "Approved",
	store.NoticeApprovalDenied:    "Denied",
	store.NoticeApprovalExpired:   "Expired",
	store.NoticeApprovalEscalated: "Escalated, approval requested",
}

// slackEscape escapes the three characters Slack's mrkdwn reserves.
var slackEscape = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

// SlackBody renders n for a Slack-compatible incoming webhook: {"text": ...} in mrkdwn, with
// the tool, run, actor, redacted preview, risk, roles and quorum, expiry and the exact
// commands. Every value is escaped (&, <, >), and the preview sits in a code block.
//
// An alert (store.IsAlert) reads as one line saying what happened on which gateway to which
// object, run or upstream, then the details and what to do.
func SlackBody(n store.Notice, gateway, storeFlags string) ([]byte, error) {
	if store.IsAlert(n.Type) {
		return alertSlackBody(n, gateway, storeFlags)
	}
	e := slackEscape.Replace
	var b strings.Builder
	title := titles[n.Type]
	if title == "" {
		title = n.Type
	}
	fmt.Fprintf(&b, "*%s*: `%s` (request %s)", title, e(n.Tool), e(n.Approval))
	if gateway != "" {
		fmt.Fprintf(&b, " on gateway %s", e(gateway))
	}
	if n.Namespace != "" {
		fmt.Fprintf(&b, " in namespace %s", e(n.Namespace))
	}
	fmt.Fprintf(&b, "\n*Run:* %s   *Actor:* %s", e(n.Run), e(n.Actor))
	if n.Reason != "" {
		fmt.Fprintf(&b, "\n*Reason:* %s", e(n.Reason))
	}
	if n.ArgumentsPreview != "" {
		// A backtick inside the preview could end the code block early (replacing only "```"
		// leaves one in "`````"), and the rest would be read as mrkdwn: every backtick becomes
		// U+02CB (modifier letter grave accent), which looks the same and ends nothing.
		fmt.Fprintf(&b, "\n*Arguments (redacted):*\n```%s```", e(strings.ReplaceAll(n.ArgumentsPreview, "`", "\u02cb")))
	}
	fmt.Fprintf(&b, "\n*Risk:* %s", e(riskText(n.Risk)))
	roles := "any principal but the actor"
	if len(n.Roles) > 0 {
		roles = strings.Join(n.Roles, ", ")
	}
	fmt.Fprintf(&b, "\n*Approvers:* %s (quorum %d)", e(roles), n.Quorum)
	if !n.Expires.IsZero() {
		fmt.Fprintf(&b, "\n*Expires:* %s", n.Expires.UTC().Format(time.RFC3339))
	}
	if len(n.DecidedBy) > 0 {
		fmt.Fprintf(&b, "\n*Decided by:* %s", e(strings.Join(n.DecidedBy, ", ")))
	}
	if n.Note != "" && !decides(n.Type) {
		fmt.Fprintf(&b, "\n%s", e(n.Note))
	}
	if decides(n.Type) {
		approve, deny := Commands(n, storeFlags)
		fmt.Fprintf(&b, "\n*Approve:* `%s`\n*Deny:* `%s`", e(approve), e(deny))
	}
	return json.Marshal(map[string]string{"text": b.String()})
}

func riskText(r store.Risk) string {
	var parts []string
	if r.BlastRadius != "" {
		parts = append(parts, "blast radius "+r.BlastRadius)
	}
	if r.DataClass != "" {
		parts = append(parts, "data class "+r.DataClass)
	}
	if r.Environment != "" {
		parts = append(parts, "environment "+r.Environment)
	}
	if len(parts) == 0 {
		return "not recorded in the manifest"
	}
	return strings.Join(parts, ", ")
}
