package argocd

import (
	"regexp"
	"strings"
	"testing"
)

// Argo CD has no prelude shared by health scripts, so each carries the kstatus reading
// (health/common.lua, once); and none uses what Argo CD's sandbox (no useOpenLibs) lacks: the
// string library (string.x, or s:x(), which needs the string metatable), io, os and require.
func TestScriptsCarryTheCommonReadingAndUseOnlyTheSandbox(t *testing.T) {
	common, err := scripts.ReadFile("health/common.lua")
	if err != nil {
		t.Fatal(err)
	}
	forbidden := regexp.MustCompile(`\bstring\.|\bio\.|\bos\.|\brequire\b|\bload(string|file)?\s*\(|\bdofile\b|[\w\)\]"]:\w+\s*\(`)
	for _, kind := range Kinds {
		s, err := HealthScript(kind)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(s, string(common)); n != 1 {
			t.Fatalf("%s: health/common.lua appears %d times, want once", kind, n)
		}
		if i := strings.Index(s, string(common)); i > strings.Index(s, "local function assess") {
			t.Fatalf("%s: the common reading comes after the kind's code", kind)
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
