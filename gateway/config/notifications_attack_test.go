package config

import (
	"strings"
	"testing"
)

// TestAttackEmptySecretSendsUnsigned (issue 24, red team): `secret: ${HOOK_SECRET}` asks for
// signed deliveries. A variable that is set but empty (an empty key of the Secret the
// controller renders into the pod's environment, `export HOOK_SECRET=`) gave Secret "", and
// the deliveries went out without X-Reversi-Signature: a receiver that takes a missing
// signature for "not configured" accepts anyone's posts, a strict one drops every real one,
// and nothing told the operator. It is an error at start now, naming the field and never the
// value; likewise an empty $REVERSI_APPROVAL_WEBHOOK_SECRET and a URL that expands to nothing.
// The honest path (a secret, and no secret at all) stays accepted.
func TestAttackEmptySecretSendsUnsigned(t *testing.T) {
	const head = "upstreams: [{name: fs, command: srv}]\n"
	vars := env(map[string]string{"HOOK_SECRET": "", "BLANK": "  ", "GOOD": "s3", "NO_URL": ""})
	for _, c := range []struct{ yaml, want string }{
		{"notifications: [{type: webhook, url: 'https://h.example.com', secret: '${HOOK_SECRET}'}]", "g.yaml:2: notifications[0].secret: ${HOOK_SECRET} is empty"},
		{"notifications: [{type: webhook, url: 'https://h.example.com', secret: '${BLANK}'}]", "g.yaml:2: notifications[0].secret: ${BLANK} is empty"},
		{"notifications: [{type: webhook, url: '${NO_URL}', name: a}]", "g.yaml:2: notifications[0].url: ${NO_URL} is empty"},
	} {
		_, errs := Parse("g.yaml", []byte(head+c.yaml+"\n"), vars)
		if len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), c.want) {
			t.Errorf("%s:\n got  %v\n want %s", c.yaml, errs, c.want)
		}
	}
	if _, _, err := ApprovalWebhook(env(map[string]string{ApprovalWebhookEnv: "https://h.example.com/x", ApprovalWebhookSecretEnv: ""})); err == nil ||
		!strings.Contains(err.Error(), "set but empty") {
		t.Errorf("empty $%s: %v", ApprovalWebhookSecretEnv, err)
	}
	// honest
	g, errs := Parse("g.yaml", []byte(head+"notifications: [{type: webhook, url: 'https://h.example.com', secret: '${GOOD}'}, {type: webhook, name: b, url: 'https://i.example.com'}]\n"), vars)
	if len(errs) > 0 || g.Notifications[0].Secret != "s3" || g.Notifications[1].Secret != "" {
		t.Fatalf("%+v %v", g, errs)
	}
	if n, ok, err := ApprovalWebhook(env(map[string]string{ApprovalWebhookEnv: "https://h.example.com/x"})); err != nil || !ok || n.Secret != "" {
		t.Fatalf("unsigned by choice: %+v %v", n, err)
	}
}
