package engine

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestAttackPreviewRedactionBypass (issue 24, red team): the arguments preview is what the
// approvers' webhook and Slack channel read. An agent's arguments carrying a credential under
// a name spelled in one of the common ways the word list missed, or as a {name, value} pair
// (HTTP headers and environment variables given as a list), reached them in clear. Each
// case's secret must be gone from the preview; the honest fields stay readable.
func TestAttackPreviewRedactionBypass(t *testing.T) {
	const s = "sk-live-4411"
	for name, args := range map[string]map[string]any{
		"hyphenated header":  {"headers": map[string]any{"X-Api-Key": s}},
		"api key with space": {"api key": s},
		"private-key":        {"ssh": map[string]any{"private-key": s}},
		"dotted":             {"Private.Key": s},
		"cookie":             {"request": map[string]any{"Cookie": "session=" + s}},
		"passphrase":         {"passphrase": s},
		"fullwidth":          {"ｐａｓｓｗｏｒｄ": s},
		"header pair list":   {"headers": []any{map[string]any{"name": "Authorization", "value": "Bearer " + s}, map[string]any{"name": "Accept", "value": "text/plain"}}},
		"env pair list":      {"env": []any{map[string]any{"key": "DB_PASSWORD", "value": s}}},
	} {
		got := ArgumentsPreview(nil, args)
		if strings.Contains(got, s) {
			t.Errorf("%s: the secret reaches the approvers: %s", name, got)
		}
	}
	// the honest path: what is not a secret stays readable, names of pairs included
	got := ArgumentsPreview(nil, map[string]any{"amount": 120, "headers": []any{map[string]any{"name": "Authorization", "value": "x"},
		map[string]any{"name": "Accept", "value": "text/plain"}}, "api_version": "v2", "keyword": "refund"})
	for _, want := range []string{`"amount":120`, `"name":"Authorization"`, `"value":"[redacted]"`, `"value":"text/plain"`, `"api_version":"v2"`, `"keyword":"refund"`} {
		if !strings.Contains(got, want) {
			t.Errorf("the honest preview lost %s: %s", want, got)
		}
	}
}

// TestAttackPreviewInvisibleCharacters (issue 24, red team): the agent's arguments may hold a
// bidi override (U+202E: the approvers' Slack, console or terminal show the rest of the line
// reversed, "amount":1000 as 0001:"tnuoma"), zero-width characters, a C1 CSI, or tag
// characters (U+E0000…, invisible text). The preview writes them as \u escapes: the same JSON
// (it decodes to the same arguments), nothing invisible in it.
func TestAttackPreviewInvisibleCharacters(t *testing.T) {
	args := map[string]any{"a": "\u202e", "amount": 1000, "note": "x\u200by\u009b2J\U000E0041\U000E0042 \u2066ok\u2069", "plain": "café ünïcode 日本"}
	got := ArgumentsPreview(nil, args)
	for _, r := range got {
		if invisible(r) {
			t.Fatalf("%U in the preview: %q", r, got)
		}
	}
	var back map[string]any
	if err := json.Unmarshal([]byte(got), &back); err != nil || back["a"] != "\u202e" || back["note"] != args["note"] || back["plain"] != "café ünïcode 日本" {
		t.Fatalf("the preview %q decodes to %v (%v)", got, back, err)
	}
	if !strings.Contains(got, `"amount":1000`) || !strings.Contains(got, "café ünïcode 日本") {
		t.Fatalf("honest text changed: %s", got)
	}
}
