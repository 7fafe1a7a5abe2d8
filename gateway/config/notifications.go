package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// Notification is one entry of `notifications:` (gateway.yaml or reversi.config.yaml): a
// receiver of the approval events and alerts (issue 24). URL and Secret hold the values after ${NAME}
// expansion from the environment.
//
//	notifications:
//	  - type: webhook                  # or slack (a Slack-compatible incoming webhook)
//	    url: https://hooks.example.com/reversi
//	    secret: ${REVERSI_WEBHOOK_SECRET}  # webhook: the HMAC-SHA256 key of X-Reversi-Signature
//	    events: [approval.requested]   # default: every approval event
//	    tools: ["payments.*"]          # tool globs; default: every tool
//	    risk: [high, critical]         # the manifest's risk.blast_radius; default: any
//	    namespaces: [payments]         # Kubernetes namespaces; default: any
type Notification struct {
	// Name identifies the receiver in the outbox (`name:`, default "<type>-<8 hex of the
	// URL's SHA-256>"): rows pending for a name that is no longer configured are dead-lettered.
	Name string
	// Type is NotifyWebhook or NotifySlack.
	Type string
	// URL is the receiver's http or https URL.
	URL string
	// Secret is the webhook's shared secret ("" sends no signature); slack takes none.
	Secret string
	// Events are the notice types sent (store.NoticeTypes); empty: all of them.
	Events []string
	// Tools are tool-name globs (path.Match syntax, as allow/deny); empty: every tool.
	Tools []string
	// Risk are the blast radii sent (low, medium, high, critical); empty: any, also none.
	Risk []string
	// Namespaces are the Kubernetes namespaces sent (the namespace of the object a notice is
	// about); empty: every namespace, also none (a standalone gateway's notices have none).
	Namespaces []string
	// Where is "file:line" of the entry ("" when it came from the environment), Field its
	// path ("notifications[0]"): for the errors found after decoding (egress).
	Where, Field string
}

// The notification types.
const (
	NotifyWebhook = "webhook"
	NotifySlack   = "slack"
)

// NotificationEvents are the values of `events:` (store.NoticeTypes; kept here so that the
// config package does not import the store): the approval events, then the alerts (issue 24).
var NotificationEvents = []string{"approval.requested", "approval.approved", "approval.denied", "approval.expired", "approval.escalated",
	"alert.reload_refused", "alert.rendering_refused", "alert.rollback_failed", "alert.halted", "alert.resumed", "alert.upstream_down"}

// ApprovalEvents are the approval events of NotificationEvents ($REVERSI_APPROVAL_WEBHOOK's).
var ApprovalEvents = NotificationEvents[:5]

// notificationRisks are the values of `risk:` (manifest risk.blast_radius).
var notificationRisks = []string{"low", "medium", "high", "critical"}

var notificationFields = []string{"name", "type", "url", "secret", "events", "tools", "risk", "namespaces"}

// ApprovalWebhookEnv names the environment variable of the seed's approval webhook (seed "MCP
// gateway", Storage and notifications: "`REVERSI_APPROVAL_WEBHOOK` still works"): when set, a
// generic webhook receives every approval event, signed with $REVERSI_APPROVAL_WEBHOOK_SECRET
// when that is set.
const (
	ApprovalWebhookEnv       = "REVERSI_APPROVAL_WEBHOOK"
	ApprovalWebhookSecretEnv = "REVERSI_APPROVAL_WEBHOOK_SECRET"
)

// ApprovalWebhook is the receiver $REVERSI_APPROVAL_WEBHOOK names (ok false when it is unset
// or blank). An URL that is not http(s) is an error naming the variable.
func ApprovalWebhook(lookup LookupFunc) (Notification, bool, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	u, _ := lookup(ApprovalWebhookEnv)
	u = strings.TrimSpace(u)
	if u == "" {
		return Notification{}, false, nil
	}
	if err := checkHTTPURL(u); err != nil {
		return Notification{}, false, fmt.Errorf("$%s: %v", ApprovalWebhookEnv, err)
	}
	secret, set := lookup(ApprovalWebhookSecretEnv)
	if set && strings.TrimSpace(secret) == "" {
		// set (to sign) but empty: the deliveries would go unsigned
		return Notification{}, false, fmt.Errorf("$%s is set but empty: the deliveries of $%s would not be signed (unset it for no signature)", ApprovalWebhookSecretEnv, ApprovalWebhookEnv)
	}
	// The seed's variable is an approval webhook: it gets the approval events, not the alerts
	// (issue 24), which a `notifications:` receiver asks for.
	return Notification{Name: "approval-webhook", Type: NotifyWebhook, URL: u, Secret: secret, Events: slices.Clone(ApprovalEvents),
		Field: "$" + ApprovalWebhookEnv}, true, nil
}

// ParseNotifications reads only `notifications:` of a file whose other fields another decoder
// reads (reversi.config.yaml, internal/config), with the same rules and errors (file, line,
// field) as gateway.yaml's.
func ParseNotifications(file string, data []byte, lookup LookupFunc) ([]Notification, []error) {
	if lookup == nil {
		lookup = func(string) (string, bool) { return "", false }
	}
	docs, errs := manifest.ParseFile(file, data)
	if len(errs) > 0 || len(docs) != 1 {
		return nil, errs // the file's own decoder reports these
	}
	m, ok := docs[0].Value.(map[string]any)
	if !ok {
		return nil, nil
	}
	d := &decoder{file: file, doc: &docs[0], lookup: lookup}
	out := d.notifications(m)
	if len(d.errs) > 0 {
		manifest.SortErrors(d.errs)
		return nil, d.errs
	}
	return out, nil
}

// notifications reads `notifications:`; names are unique.
func (d *decoder) notifications(m map[string]any) []Notification {
	v, ok := m["notifications"]
	if !ok || v == nil {
		return nil
	}
	l, ok := v.([]any)
	if !ok {
		d.fail("notifications", "expected a list of receivers, found %s", manifest.Describe(v))
		return nil
	}
	var out []Notification
	names := map[string]string{}
	for i, e := range l {
		p := index("notifications", i)
		o := d.object(e, p, notificationFields...)
		if o == nil {
			continue
		}
		n := Notification{Field: p, Where: fmt.Sprintf("%s:%d", d.file, d.doc.Line(p))}
		bad := len(d.errs)
		typ, ok := d.enum(o, p, "type", NotifyWebhook, NotifySlack)
		if !ok && o["type"] == nil {
			d.fail(join(p, "type"), "required: webhook or slack")
		}
		n.Type = typ
		if raw, ok := d.nonEmpty(o, p, "url"); ok {
			before := len(d.errs)
			s := d.expand(join(p, "url"), raw)
			switch err := checkHTTPURL(s); {
			case s == "" && len(d.errs) == before:
				d.fail(join(p, "url"), "%s is empty: the receiver's http or https URL is required", raw)
			case s == "" || err == nil:
			case s != raw: // never repeat an expanded value: it may hold a token
				d.fail(join(p, "url"), "the value of %s is not an http or https URL", raw)
			default:
				d.fail(join(p, "url"), "%v", err)
			}
			n.URL = s
		} else if o["url"] == nil {
			d.fail(join(p, "url"), "required: the receiver's http or https URL")
		}
		if s, ok := d.nonEmpty(o, p, "secret"); ok {
			if typ == NotifySlack {
				d.fail(join(p, "secret"), "a slack incoming webhook takes no secret (its URL is the secret): leave it out")
			}
			bad := len(d.errs)
			n.Secret = d.expand(join(p, "secret"), s)
			if len(d.errs) == bad && strings.TrimSpace(n.Secret) == "" {
				// `secret:` asks for signed deliveries: a variable that is set but empty (an
				// empty Secret key in Kubernetes, `export X=`) would send them unsigned.
				d.fail(join(p, "secret"), "%s is empty: the deliveries would not be signed (leave secret out for no signature)", s)
			}
		}
		n.Events, _ = d.strList(o, p, "events", func(ep, s string) bool {
			if !slices.Contains(NotificationEvents, s) {
				d.fail(ep, "%q is not one of %s", s, strings.Join(NotificationEvents, ", "))
				return false
			}
			return true
		})
		n.Tools, _ = d.strList(o, p, "tools", d.glob)
		n.Risk, _ = d.strList(o, p, "risk", func(ep, s string) bool {
			if !slices.Contains(notificationRisks, s) {
				d.fail(ep, "%q is not one of %s (the manifest's risk.blast_radius)", s, strings.Join(notificationRisks, ", "))
				return false
			}
			return true
		})
		n.Namespaces, _ = d.strList(o, p, "namespaces", func(ep, s string) bool {
			if errs := validation.IsDNS1123Label(s); len(errs) > 0 {
				d.fail(ep, "%q is not a namespace name: %s", s, strings.Join(errs, "; "))
				return false
			}
			return true
		})
		if s, ok := d.nonEmpty(o, p, "name"); ok {
			if !upstreamNamePattern.MatchString(s) {
				d.fail(join(p, "name"), "%q is not a valid name: letters, digits, _ and -", s)
			}
			n.Name = s
		} else if n.URL != "" {
			sum := sha256.Sum256([]byte(n.URL))
			n.Name = n.Type + "-" + hex.EncodeToString(sum[:4])
		}
		if prev, dup := names[n.Name]; dup && n.Name != "" {
			d.fail(p, "receiver %s is also %s: give one of them another name:", n.Name, prev)
		}
		names[n.Name] = p
		if len(d.errs) == bad {
			out = append(out, n)
		}
	}
	return out
}
