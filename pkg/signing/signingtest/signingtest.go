// Package signingtest makes manifest signing keys for tests.
package signingtest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/reversi-gitops/reversi/pkg/signing"
)

// Key is a fresh Ed25519 key written by signing.GenerateKeyFiles: its signer, a trust set of
// its public key alone, and the public key's PEM (what a keys Secret or a bundle holds).
type Key struct {
	Signer    *signing.Signer
	Trust     *signing.TrustSet
	PublicPEM []byte
}

// NewKey makes a key in a temporary folder.
func NewKey(t testing.TB) Key {
	t.Helper()
	prefix := filepath.Join(t.TempDir(), "mf")
	if _, err := signing.GenerateKeyFiles(prefix); err != nil {
		t.Fatal(err)
	}
	s, _, err := signing.LoadSigner(prefix + ".key")
	if err != nil {
		t.Fatal(err)
	}
	pub, err := os.ReadFile(prefix + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	ts, err := signing.ParseTrustSet(pub)
	if err != nil {
		t.Fatal(err)
	}
	return Key{Signer: s, Trust: ts, PublicPEM: pub}
}
