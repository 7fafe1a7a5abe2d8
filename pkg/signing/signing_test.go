package signing

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func newKey(t *testing.T, dir, name string) (prefix, id string) {
	t.Helper()
	prefix = filepath.Join(dir, name)
	id, err := GenerateKeyFiles(prefix)
	if err != nil {
		t.Fatal(err)
	}
	return prefix, id
}

func TestKeygenFilesAndSignVerify(t *testing.T) {
	dir := t.TempDir()
	prefix, id := newKey(t, dir, "keys/mf") // keygen creates the folder
	if len(id) != 16 {
		t.Fatalf("key id %q", id)
	}
	key, err := os.Stat(prefix + ".key")
	if err != nil || key.Mode().Perm() != 0o600 {
		t.Fatalf("key mode %v %v", key.Mode(), err)
	}
	pubPEM, _ := os.ReadFile(prefix + ".pub")
	privPEM, _ := os.ReadFile(prefix + ".key")
	if !bytes.HasPrefix(pubPEM, []byte("-----BEGIN PUBLIC KEY-----")) || !bytes.HasPrefix(privPEM, []byte("-----BEGIN PRIVATE KEY-----")) {
		t.Fatalf("PEM types: %q / %q", pubPEM[:30], privPEM[:30])
	}
	if _, err := GenerateKeyFiles(prefix); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("overwrite: %v", err)
	}

	s, warning, err := LoadSigner(prefix + ".key")
	if err != nil || warning != "" || s.KeyID != id {
		t.Fatalf("signer %v %q %v", s, warning, err)
	}
	ts, err := LoadTrustSet(prefix + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	msg := Message("stripe.refund", 2, "abc")
	if string(msg) != "reversi-manifest:stripe.refund@2:abc" {
		t.Fatalf("message %q", msg)
	}
	sig, err := s.Sign(msg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ts.Verify(id, sig, msg); err != nil {
		t.Fatal(err)
	}
	if err := ts.Verify(id, sig, Message("stripe.refund", 3, "abc")); err == nil || !strings.Contains(err.Error(), "does not verify with key "+id) {
		t.Fatalf("other version verified: %v", err)
	}
	if err := ts.Verify("0000000000000000", sig, msg); err == nil || !strings.Contains(err.Error(), "not trusted") {
		t.Fatalf("unknown key id: %v", err)
	}
}

// Verify's refusals are typed (errors.Is), so callers never match the text; the text stays the
// sentence it was (the sentinel reads as part of it).
func TestVerifyErrorsAreTyped(t *testing.T) {
	prefix, id := newKey(t, t.TempDir(), "mf")
	s, _, err := LoadSigner(prefix + ".key")
	if err != nil {
		t.Fatal(err)
	}
	ts, err := LoadTrustSet(prefix + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	msg := Message("stripe.refund", 2, "abc")
	sig, _ := s.Sign(msg)

	bad := ts.Verify(id, sig, Message("stripe.refund", 3, "abc"))
	if !errors.Is(bad, ErrBadSignature) || errors.Is(bad, ErrUntrusted) || !IsSignatureError(bad) {
		t.Errorf("a signature over another message: %v", bad)
	}
	if want := "the signature does not verify with key " + id + ": the manifest, its tool or version was changed after signing, or it was signed by another key"; bad.Error() != want {
		t.Errorf("text %q, want %q", bad, want)
	}
	untrusted := ts.Verify("0000000000000000", sig, msg)
	if !errors.Is(untrusted, ErrUntrusted) || errors.Is(untrusted, ErrBadSignature) || !IsSignatureError(untrusted) {
		t.Errorf("an untrusted key: %v", untrusted)
	}
	for _, e := range []error{ErrNotSigned, ErrMalformedSignature} {
		if !IsSignatureError(fmt.Errorf("x: %w", e)) {
			t.Errorf("%v is not a signature error", e)
		}
	}
	// A message that only mentions signatures is not one.
	if IsSignatureError(errors.New("json: unknown field \"signature\": the signature was not trusted")) || IsSignatureError(nil) {
		t.Error("text decided the classification")
	}
}

func TestLoadSignerWarnsAndRefuses(t *testing.T) {
	dir := t.TempDir()
	prefix, _ := newKey(t, dir, "mf")
	if err := os.Chmod(prefix+".key", 0o644); err != nil {
		t.Fatal(err)
	}
	if _, warning, err := LoadSigner(prefix + ".key"); err != nil || !strings.Contains(warning, "readable by others") {
		t.Fatalf("warning %q err %v", warning, err)
	}
	bad := filepath.Join(dir, "bad.key")
	for body, want := range map[string]string{
		"not a key": "not a PEM",
		"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n": "malformed private key",
	} {
		if err := os.WriteFile(bad, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := LoadSigner(bad); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), bad) {
			t.Errorf("%q: err %v, want %q naming the file", body, err, want)
		}
	}
	// A public key is not a signing key.
	if _, _, err := LoadSigner(prefix + ".pub"); err == nil {
		t.Fatal("public key accepted as a signing key")
	}
}

func TestTrustSetBundle(t *testing.T) {
	dir := t.TempDir()
	a, idA := newKey(t, dir, "a")
	b, idB := newKey(t, dir, "b")
	pa, _ := os.ReadFile(a + ".pub")
	pb, _ := os.ReadFile(b + ".pub")
	ts, err := ParseTrustSet(append(pa, pb...))
	if err != nil {
		t.Fatal(err)
	}
	if ids := ts.KeyIDs(); len(ids) != 2 || !(ids[0] == idA || ids[1] == idA) || !(ids[0] == idB || ids[1] == idB) {
		t.Fatalf("ids %v", ids)
	}
	for body, want := range map[string]string{
		"":                           "no public key",
		string(pa) + "trailing junk": "not a PEM block",
		string(pa) + "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n": "key 2",
	} {
		if _, err := ParseTrustSet([]byte(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bundle %q: err %v, want %q", body, err, want)
		}
	}
}
