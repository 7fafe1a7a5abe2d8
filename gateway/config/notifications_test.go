package config

import (
	"reflect"
	"strings"
	"testing"
)

// TestNotifications: `notifications:` in gateway.yaml: ${NAME} expansion in url and secret,
// the defaults (a name from the type and the URL's digest), and every rule's error with the
// file, the line and the field. Source: issue 24 (Configuration).
func TestNotifications(t *testing.T) {
	const file = `upstreams: [{name: fs, command: srv}]
notifications:
  - type: webhook
    url: https://hooks.example.com/reversi?t=${HOOK_TOKEN}
    secret: ${HOOK_SECRET}
    events: [approval.requested, approval.approved]
    tools: ["payments.*"]
    risk: [high, critical]
    namespaces: [payments]
  - {type: slack, name: chat, url: "${SLACK_URL}", events: [alert.rendering_refused]}
`
	g, errs := Parse("gateway.yaml", []byte(file), env(map[string]string{"HOOK_TOKEN": "tk", "HOOK_SECRET": "s3", "SLACK_URL": "https://slack.example.com/services/T/B/X"}))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	want := []Notification{
		{Name: "webhook-" + g.Notifications[0].Name[len("webhook-"):], Type: "webhook", URL: "https://hooks.example.com/reversi?t=tk", Secret: "s3",
			Events: []string{"approval.requested", "approval.approved"}, Tools: []string{"payments.*"}, Risk: []string{"high", "critical"},
			Namespaces: []string{"payments"}, Where: "gateway.yaml:3", Field: "notifications[0]"},
		{Name: "chat", Type: "slack", URL: "https://slack.example.com/services/T/B/X", Events: []string{"alert.rendering_refused"},
			Where: "gateway.yaml:10", Field: "notifications[1]"},
	}
	if !reflect.DeepEqual(g.Notifications, want) || len(g.Notifications[0].Name) != len("webhook-")+8 {
		t.Fatalf("got  %+v\nwant %+v", g.Notifications, want)
	}

	for _, c := range []struct{ yaml, want string }{
		{"notifications: {type: webhook}", "g.yaml:2: notifications: expected a list of receivers, found an object"},
		{"notifications: [{url: 'https://h.example.com'}]", "g.yaml:2: notifications[0].type: required: webhook or slack"},
		{"notifications: [{type: email, url: 'https://h.example.com'}]", `g.yaml:2: notifications[0].type: "email" is not one of webhook, slack`},
		{"notifications: [{type: webhook}]", "g.yaml:2: notifications[0].url: required: the receiver's http or https URL"},
		{"notifications: [{type: webhook, url: 'ftp://h'}]", `g.yaml:2: notifications[0].url: "ftp://h" is not an http or https URL`},
		{"notifications: [{type: webhook, url: '${NOPE}'}]", "g.yaml:2: notifications[0].url: environment variable NOPE is not set"},
		{"notifications: [{type: webhook, url: '${BAD_URL}'}]", "g.yaml:2: notifications[0].url: the value of ${BAD_URL} is not an http or https URL"},
		{"notifications: [{type: slack, url: 'https://h.example.com', secret: x}]", "g.yaml:2: notifications[0].secret: a slack incoming webhook takes no secret"},
		{"notifications: [{type: webhook, url: 'https://h.example.com', events: [approval.made]}]", `g.yaml:2: notifications[0].events[0]: "approval.made" is not one of approval.requested`},
		{"notifications: [{type: webhook, url: 'https://h.example.com', tools: ['[']}]", `g.yaml:2: notifications[0].tools[0]: "[" is not a valid glob`},
		{"notifications: [{type: webhook, url: 'https://h.example.com', risk: [huge]}]", `g.yaml:2: notifications[0].risk[0]: "huge" is not one of low, medium, high, critical`},
		{"notifications: [{type: webhook, url: 'https://h.example.com', namespaces: [Payments_1]}]", `g.yaml:2: notifications[0].namespaces[0]: "Payments_1" is not a namespace name: a lowercase RFC 1123 label`},
		{"notifications: [{type: webhook, url: 'https://h.example.com', retries: 3}]", `g.yaml:2: notifications[0].retries: unknown field "retries"`},
		{"notifications: [{type: webhook, url: 'https://h.example.com', name: a}, {type: slack, url: 'https://s.example.com', name: a}]", "g.yaml:2: notifications[1]: receiver a is also notifications[0]"},
	} {
		_, errs := Parse("g.yaml", []byte("upstreams: [{name: fs, command: srv}]\n"+c.yaml+"\n"), env(map[string]string{"BAD_URL": "not a url with a s3cret"}))
		if len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), c.want) {
			t.Errorf("%s:\n got  %v\n want %s", c.yaml, errs, c.want)
		}
		for _, e := range errs {
			if strings.Contains(e.Error(), "s3cret") {
				t.Errorf("an expanded value is in the error: %v", e)
			}
		}
	}
}

// TestApprovalWebhookEnv: $REVERSI_APPROVAL_WEBHOOK is a webhook for every approval event (no alert),
// signed with $REVERSI_APPROVAL_WEBHOOK_SECRET; unset is none; a bad URL names the variable.
func TestApprovalWebhookEnv(t *testing.T) {
	n, ok, err := ApprovalWebhook(env(map[string]string{ApprovalWebhookEnv: "https://h.example.com/x", ApprovalWebhookSecretEnv: "k"}))
	if err != nil || !ok || !reflect.DeepEqual(n, Notification{Name: "approval-webhook", Type: NotifyWebhook, URL: "https://h.example.com/x", Secret: "k",
		Events: []string{"approval.requested", "approval.approved", "approval.denied", "approval.expired", "approval.escalated"}, Field: "$REVERSI_APPROVAL_WEBHOOK"}) {
		t.Fatalf("%+v %v %v", n, ok, err)
	}
	if _, ok, err := ApprovalWebhook(env(nil)); ok || err != nil {
		t.Fatalf("unset: %v %v", ok, err)
	}
	if _, _, err := ApprovalWebhook(env(map[string]string{ApprovalWebhookEnv: "hooks"})); err == nil || !strings.HasPrefix(err.Error(), "$REVERSI_APPROVAL_WEBHOOK: ") {
		t.Fatalf("bad URL: %v", err)
	}
}
