package policy

import (
	"os"
	"testing"
)

// The decoder never panics, and a policy it accepts has a canonical form that decodes again.
func FuzzParseFile(f *testing.F) {
	for _, name := range []string{"payments.yaml", "change-freeze.yaml", "content.yaml", "deletions.yaml"} {
		if b, err := os.ReadFile(fixtures + "/" + name); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("policy: p\nrules: [{name: r, effect: limit, limit: {max: 1, per: actor, window: 1h}}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ps, _ := ParseFile("f.yaml", data)
		for _, p := range ps {
			if _, err := Checksum(p); err != nil {
				t.Fatalf("checksum of an accepted policy: %v", err)
			}
		}
	})
}
