package argocd

import (
	"regexp"
	"strings"
	"testing"
)

var commonBlock = regexp.MustCompile(`(?s)-- BEGIN common.*?-- END common\n`)

// Argo CD has no prelude shared by health scripts, so each carries the kstatus reading; this
// keeps the copies identical, and keeps out what Argo CD's sandbox (no useOpenLibs) lacks: the
// string library (string.x, or s:x(), which needs the string metatable), io, os and require.
func TestScriptsShareTheCommonBlockAndUseOnlyTheSandbox(t *testing.T) {
	var first, firstKind string
	forbidden := regexp.MustCompile(`\bstring\.|\bio\.|\bos\.|\brequire\b|\bload(string|file)?\s*\(|\bdofile\b|[\w\)\]"]:\w+\s*\(`)
	for _, kind := range Kinds {
		s, err := HealthScript(kind)
		if err != nil {
			t.Fatal(err)
		}
		blocks := commonBlock.FindAllString(s, -1)
		if len(blocks) != 1 {
			t.Fatalf("%s: %d common blocks, want 1", kind, len(blocks))
		}
		if first == "" {
			first, firstKind = blocks[0], kind
		} else if blocks[0] != first {
			t.Errorf("%s's common block differs from %s's", kind, firstKind)
		}
		for i, line := range strings.Split(s, "\n") {
			code, _, _ := strings.Cut(line, "--")
			if m := forbidden.FindString(code); m != "" {
				t.Errorf("%s line %d uses %q, which Argo CD's health sandbox lacks: %s", kind, i+1, m, line)
			}
		}
		if !strings.Contains(s, HealthKey(kind)) {
			t.Errorf("%s: the header does not name its argocd-cm key %s", kind, HealthKey(kind))
		}
	}
}
