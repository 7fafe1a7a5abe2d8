package engine

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// Redacted replaces a value hidden from approvers in an arguments preview.
const Redacted = "[redacted]"

// MaxPreviewChars bounds an arguments preview (ApprovalRequest spec.argumentsPreview).
const MaxPreviewChars = 4096

// secretWords are parts of argument names whose values are hidden even when the manifest's
// audit.redaction does not list them.
// A name is compared without case and without the characters between its words ("API-Key",
// "api key", "Private.Key" are apikey and privatekey).
var secretWords = []string{"password", "passwd", "passphrase", "secret", "token", "apikey", "authorization", "credential", "privatekey", "cookie", "bearer"}

// secretName reports whether an argument (or a header's, a pair's) name looks like a secret's.
func secretName(name string) bool {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		if r >= 0xFF01 && r <= 0xFF5E { // fullwidth forms of ASCII ("ｐａｓｓｗｏｒｄ")
			r = unicode.ToLower(r - 0xFEE0)
		}
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			b.WriteRune(r)
		}
	}
	lk := b.String()
	for _, w := range secretWords {
		if strings.Contains(lk, w) {
			return true
		}
	}
	return false
}

// pairNames and pairValues are the members of a name/value pair such as
// {"name": "Authorization", "value": "Bearer ..."} (headers, environment variables, form
// fields given as a list): the value is a secret when the name looks like one.
var (
	pairNames  = []string{"name", "key", "header", "field"}
	pairValues = []string{"value", "val", "content", "data"}
)

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
	s := escapeInvisible(string(b))
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
		pair := false
		for _, n := range pairNames {
			if name, ok := x[n].(string); ok && secretName(name) {
				pair = true
			}
		}
		for k, val := range x {
			lk := strings.ToLower(k)
			if secretName(k) || pair && slices.Contains(pairValues, lk) {
				x[k] = Redacted
				continue
			}
			redactSecrets(val)
		}
	case []any:
		for _, e := range x {
			redactSecrets(e)
		}
	}
}

// escapeInvisible writes the format characters (bidi overrides and isolates, zero-width
// characters) and C1 controls of a JSON text as \uXXXX escapes: the same JSON, but a preview
// shown to approvers (ApprovalRequest, webhook, Slack, a terminal) cannot reorder or hide what
// follows (U+202E shows "amount":1000 as 0001:"tnuoma"). They can only be inside strings,
// where the escape is valid.
func escapeInvisible(s string) string {
	if !strings.ContainsFunc(s, invisible) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if invisible(r) {
			if r > 0xFFFF { // tag characters (U+E0000…) hide text: a surrogate pair
				r1, r2 := utf16.EncodeRune(r)
				fmt.Fprintf(&b, "\\u%04x\\u%04x", r1, r2)
			} else {
				fmt.Fprintf(&b, "\\u%04x", r)
			}
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func invisible(r rune) bool {
	return r >= 0x80 && (unicode.IsControl(r) || unicode.Is(unicode.Cf, r))
}
