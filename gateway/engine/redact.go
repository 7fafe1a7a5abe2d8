package engine

import (
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// Redacted replaces a value hidden from approvers in an arguments preview.
const Redacted = "[redacted]"

// MaxPreviewChars bounds an arguments preview (ApprovalRequest spec.argumentsPreview).
const MaxPreviewChars = 4096

// secretWords are parts of argument names whose values are hidden even when the manifest's
// audit.redaction does not list them.
var secretWords = []string{"password", "passwd", "secret", "token", "apikey", "api_key", "authorization", "credential", "private_key", "privatekey"}

// ArgumentsPreview is the call's arguments as JSON for the people who approve it: every path
// the manifest's audit.redaction names ($args.<dotted path>) and every field whose name looks
// like a secret (password, token, api_key, …) is replaced with "[redacted]"; the text is cut
// to MaxPreviewChars characters. Source: DESIGN.md "ApprovalRequest" (redacted
// argumentsPreview), issue 8 ("redacted argument preview using audit.redaction").
func ArgumentsPreview(m *manifest.Manifest, args map[string]any) string {
	var v any = map[string]any{}
	if args != nil {
		b, err := json.Marshal(args)
		if err != nil || json.Unmarshal(b, &v) != nil {
			return ""
		}
	}
	if m != nil && m.Audit != nil {
		for _, ref := range m.Audit.Redaction {
			if path, ok := strings.CutPrefix(ref, "$args."); ok {
				redactPath(v, strings.Split(path, "."))
			}
		}
	}
	redactSecrets(v)
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	s := string(b)
	if utf8.RuneCountInString(s) <= MaxPreviewChars {
		return s
	}
	const more = "…(truncated)"
	r := []rune(s)
	return string(r[:MaxPreviewChars-utf8.RuneCountInString(more)]) + more
}

// redactPath replaces the value at path (object fields and array indexes, as manifest.Lookup).
func redactPath(v any, path []string) {
	if len(path) == 0 {
		return
	}
	switch x := v.(type) {
	case map[string]any:
		next, ok := x[path[0]]
		if !ok {
			return
		}
		if len(path) == 1 {
			x[path[0]] = Redacted
			return
		}
		redactPath(next, path[1:])
	case []any:
		for i := range x {
			if path[0] == "*" || path[0] == itoa(i) {
				if len(path) == 1 {
					x[i] = Redacted
				} else {
					redactPath(x[i], path[1:])
				}
			}
		}
	}
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

// redactSecrets hides the values of fields named like secrets, at any depth.
func redactSecrets(v any) {
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			lk := strings.ToLower(k)
			for _, w := range secretWords {
				if strings.Contains(lk, w) {
					x[k] = Redacted
					break
				}
			}
			if x[k] != Redacted {
				redactSecrets(val)
			}
		}
	case []any:
		for _, e := range x {
			redactSecrets(e)
		}
	}
}
