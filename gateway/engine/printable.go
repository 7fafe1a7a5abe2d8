package engine

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Printable returns s when every rune of it is printable (unicode.IsPrint: letters, marks,
// numbers, punctuation, symbols and the ASCII space) and valid UTF-8, otherwise s quoted with
// strconv.Quote, so that control characters, line breaks, format characters (such as
// bidirectional overrides) and stray bytes (0x9b is a terminal's CSI) show as escapes. Names
// that come from upstreams go through it before they are printed on a terminal or in a log,
// where they could otherwise forge lines (issue 18).
func Printable(s string) string {
	if printable(s) {
		return s
	}
	return strconv.Quote(s)
}

// EscapeControl returns s with what Printable would quote replaced by its Go escape (\n,
// \x1b, \u202e, \x9b), and no quotes added: for log lines whose text mixes the gateway's words
// with values from elsewhere.
func EscapeControl(s string) string {
	if printable(s) {
		return s
	}
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && n == 1:
			q := strconv.Quote(s[:1])
			b.WriteString(q[1 : len(q)-1])
		case unicode.IsPrint(r):
			b.WriteString(s[:n])
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		s = s[n:]
	}
	return b.String()
}

func printable(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}
