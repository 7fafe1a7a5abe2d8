package engine

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/reversi-gitops/reversi/api/manifest"
)

func TestArgumentsPreview(t *testing.T) {
	m := &manifest.Manifest{Tool: "stripe.refund", Audit: &manifest.Audit{Redaction: []string{"$args.card.number", "$args.items.1.note", "$args.missing.x"}}}
	args := map[string]any{
		"amount": 1200,
		"card":   map[string]any{"number": "4242424242424242", "brand": "visa"},
		"items":  []any{map[string]any{"note": "keep"}, map[string]any{"note": "private"}},
		"auth":   map[string]any{"apiKey": "sk_live_123", "Password": "hunter2"},
	}
	got := ArgumentsPreview(m, args)
	want := `{"amount":1200,"auth":{"Password":"[redacted]","apiKey":"[redacted]"},"card":{"brand":"visa","number":"[redacted]"},"items":[{"note":"keep"},{"note":"[redacted]"}]}`
	if got != want {
		t.Errorf("preview\n got %s\nwant %s", got, want)
	}
	if args["card"].(map[string]any)["number"] != "4242424242424242" {
		t.Error("the preview changed the call's own arguments")
	}
	if got := ArgumentsPreview(nil, nil); got != "{}" {
		t.Errorf("no arguments: %q", got)
	}
	long := ArgumentsPreview(nil, map[string]any{"text": strings.Repeat("é", 5000)})
	if n := utf8.RuneCountInString(long); n != MaxPreviewChars || !strings.HasSuffix(long, "…(truncated)") {
		t.Errorf("a long preview has %d characters, ends %q", n, long[len(long)-20:])
	}
}
