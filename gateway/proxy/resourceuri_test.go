package proxy

import "testing"

// TestCanonicalURI: the forms a server may resolve a URI to, and the folders above them.
func TestCanonicalURI(t *testing.T) {
	for in, want := range map[string]string{
		"file:///data/public/../secret/key": "file:///data/secret/key",
		"file:///data//secret/./key/":       "file:///data/secret/key",
		"file:///data/%73ecret%2Fkey":       "file:///data/secret/key",
		`file:///data\secret\key`:           "file:///data/secret/key",
		"FILE://User@HOST/a?x=/y#f":         "file://host/a",
		"res://secret/b":                    "res://secret/b",
		"urn:x:%79":                         "urn:x:y",
		"not a uri %zz":                     "not a uri %zz",
		"file:///../../etc/passwd":          "file:///etc/passwd",
		"file://localhost/etc/passwd":       "file:///etc/passwd",
		"file:/etc/passwd":                  "file:///etc/passwd",
		"res://%73ecret/b":                  "res://secret/b",
		"res://%53ECRET/b%2Dc":              "res://secret/b-c",
	} {
		if got := canonicalURI(in); got != want {
			t.Errorf("canonicalURI(%q) = %q, want %q", in, got, want)
		}
	}
	var parents []string
	for p := parentURI("file:///a/b/c"); p != ""; p = parentURI(p) {
		parents = append(parents, p)
	}
	if len(parents) != 2 || parents[0] != "file:///a/b" || parents[1] != "file:///a" {
		t.Errorf("parents of file:///a/b/c: %q", parents)
	}
	if p := parentURI("res://host"); p != "" {
		t.Errorf("parent of res://host: %q, want none", p)
	}
}
