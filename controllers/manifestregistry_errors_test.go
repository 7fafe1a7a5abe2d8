package controllers

import (
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// TestLoadProblemsReason: the reason of a refused registry load follows the problems' types, as
// a registry read from a commit gives them (registry.NewFS): a refused signature is
// SignatureVerificationFailed (SourceVerified=False, with that problem as its message), anything
// else ValidationFailed, even when its text mentions a signature. It needs no API server.
func TestLoadProblemsReason(t *testing.T) {
	k, other := newKey(t), newKey(t)
	cases := []struct {
		name   string
		unsign bool                           // publish without a key
		edit   func(t *testing.T, dir string) // after publishing
		trust  *signing.TrustSet
		reason string
		is     error  // the sentinel sigErr wraps (SignatureVerificationFailed only)
		want   string // in sigErr's text, or in some problem's text
	}{
		{name: "writer not trusted", trust: other.Trust, reason: v1alpha1.ReasonSignatureVerificationFailed, is: signing.ErrUntrusted, want: "not trusted"},
		{name: "unsigned registry with trusted keys", unsign: true, trust: k.Trust, reason: v1alpha1.ReasonSignatureVerificationFailed, is: signing.ErrNotSigned, want: "not signed, but trusted keys are set"},
		{name: "signature of another tool", trust: k.Trust, edit: func(t *testing.T, dir string) {
			sig := versionField(t, dir, "stripe.get_charge", 1, "signature")
			editVersion(t, dir, "stripe.refund", 1, func(m map[string]any) { m["signature"] = sig })
			editIndex(t, dir, func(m map[string]any) { entryOf(m, "stripe.refund", 1)["signature"] = sig })
		}, reason: v1alpha1.ReasonSignatureVerificationFailed, is: signing.ErrBadSignature, want: "does not verify with key"},
		// Problems whose text names a signature but that refuse none: matching the text called
		// both SignatureVerificationFailed.
		{name: "version file with an unknown field named signatures", trust: k.Trust, edit: func(t *testing.T, dir string) {
			editVersion(t, dir, "stripe.refund", 1, func(m map[string]any) { m["signatures"] = []string{} })
		}, reason: v1alpha1.ReasonValidationFailed, want: `unknown field "signatures"`},
		{name: "version file's copy of the signature edited", trust: k.Trust, edit: func(t *testing.T, dir string) {
			editVersion(t, dir, "stripe.refund", 1, func(m map[string]any) { m["signature"] = "AAAA" })
		}, reason: v1alpha1.ReasonValidationFailed, want: "([signature] differ)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "reg")
			opts := registry.WriteOptions{By: "alice"}
			if !c.unsign {
				opts.Signer = k.Signer
			}
			if _, err := registry.New(dir).Publish(fixtures(t), manifest.Approved, opts); err != nil {
				t.Fatal(err)
			}
			if c.edit != nil {
				c.edit(t, dir)
			}
			_, errs := registry.NewFS("reg", os.DirFS(dir)).Load(c.trust)
			if len(errs) == 0 {
				t.Fatal("the registry loaded")
			}
			reason, sigErr := loadProblemsReason(errs)
			if reason != c.reason {
				t.Fatalf("reason %s, want %s (problems %v)", reason, c.reason, errs)
			}
			if c.is == nil {
				if sigErr != nil {
					t.Fatalf("sigErr %v", sigErr)
				}
				if !strings.Contains(errors.Join(errs...).Error(), c.want) {
					t.Fatalf("no problem says %q: %v", c.want, errs)
				}
				return
			}
			if !errors.Is(sigErr, c.is) || !strings.Contains(sigErr.Error(), c.want) {
				t.Fatalf("sigErr %v, want %v saying %q", sigErr, c.is, c.want)
			}
		})
	}
	// A problem without a typed cause is never a signature problem, whatever it says.
	if reason, sigErr := loadProblemsReason([]error{&registry.Problem{File: registry.IndexFile, Message: "the signature is not trusted: not signed"}}); reason != v1alpha1.ReasonValidationFailed || sigErr != nil {
		t.Fatalf("text decided: %s %v", reason, sigErr)
	}
}

func versionJSON(dir, tool string, v int) string {
	return filepath.Join(dir, "tools", url.PathEscape(tool), "v"+strconv.Itoa(v)+".json")
}

func versionField(t *testing.T, dir, tool string, v int, field string) any {
	t.Helper()
	var out any
	editVersion(t, dir, tool, v, func(m map[string]any) { out = m[field] })
	return out
}

func editVersion(t *testing.T, dir, tool string, v int, edit func(map[string]any)) {
	t.Helper()
	editJSONFile(t, versionJSON(dir, tool, v), edit)
}

func editIndex(t *testing.T, dir string, edit func(map[string]any)) {
	t.Helper()
	editJSONFile(t, filepath.Join(dir, registry.IndexFile), edit)
}

func entryOf(index map[string]any, tool string, v int) map[string]any {
	return index["tools"].(map[string]any)[tool].([]any)[v-1].(map[string]any)
}

func editJSONFile(t *testing.T, path string, edit func(map[string]any)) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}
