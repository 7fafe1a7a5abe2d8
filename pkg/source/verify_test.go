package source_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/pkg/source"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

func keyRing(t *testing.T, data map[string][]byte) *source.KeyRing {
	t.Helper()
	kr, err := source.ParseKeys(data)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

func verify(t *testing.T, url string, ref source.Ref, mode source.Mode, keys *source.KeyRing) (*source.Artifact, *source.Verification, error) {
	t.Helper()
	a := fetch(t, source.Options{URL: url, Ref: ref, AllowFileURLs: true})
	v, err := source.Verify(a, mode, keys)
	return a, v, err
}

func TestParseKeys(t *testing.T) {
	alice, bob := sourcetest.NewSSHKey(t), sourcetest.NewSSHKey(t)
	kr := keyRing(t, map[string][]byte{
		"team.sshpub": []byte("# the team\n\n" + string(alice.AuthorizedKey) + "  \n" + string(bob.AuthorizedKey)),
		"README":      []byte("ignored"),
	})
	if kr.Len() != 2 {
		t.Fatalf("Len = %d, want 2", kr.Len())
	}
	for name, data := range map[string]map[string][]byte{
		"bad ssh line":    {"a.sshpub": []byte("ssh-ed25519 not-base64")},
		"empty ssh entry": {"a.sshpub": []byte("# only a comment\n")},
		"bad armor":       {"a.asc": []byte("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\ngarbage\n-----END PGP PUBLIC KEY BLOCK-----\n")},
		"no key entries":  {"identity": alice.PrivateKey, "alice.pub": alice.AuthorizedKey},
		"nothing":         {},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := source.ParseKeys(data)
			assertKind(t, err, source.ErrInvalidKeys)
		})
	}
}

func TestVerifySSHSignedCommits(t *testing.T) {
	trusted, untrusted := sourcetest.NewSSHKey(t), sourcetest.NewSSHKey(t)
	keys := keyRing(t, map[string][]byte{"alice.sshpub": trusted.AuthorizedKey})
	r := sourcetest.NewRepo(t)
	r.WriteFile("a.txt", "1")
	signed := r.CommitSigned("signed", trusted)
	r.Branch("signed")
	r.WriteFile("a.txt", "2")
	unsigned := r.Commit("unsigned")
	r.Branch("unsigned")
	r.WriteFile("a.txt", "3")
	stranger := r.CommitSigned("signed by a stranger", untrusted)
	r.Branch("stranger")
	r.Checkout("tampered")
	r.WriteFile("a.txt", "4")
	r.CommitSigned("will be tampered", trusted)
	forged := r.TamperCommit("tampered")
	url := r.FileURL()

	t.Run("trusted key", func(t *testing.T) {
		a, v, err := verify(t, url, source.Ref{Branch: "signed"}, source.ModeHEAD, keys)
		if err != nil {
			t.Fatal(err)
		}
		if a.Commit != signed || v.Commit == nil || v.Tag != nil {
			t.Fatalf("verification %+v for %s", v, a.Commit)
		}
		if v.Commit.Type != source.SignatureSSH || v.Commit.Fingerprint != trusted.Fingerprint || v.Commit.Entry != "alice.sshpub" {
			t.Fatalf("signer %+v, want %s from alice.sshpub", v.Commit, trusted.Fingerprint)
		}
	})
	t.Run("empty mode means HEAD", func(t *testing.T) {
		if _, v, err := verify(t, url, source.Ref{Commit: signed}, "", keys); err != nil || v.Commit == nil {
			t.Fatalf("%+v %v", v, err)
		}
	})
	t.Run("unsigned", func(t *testing.T) {
		_, _, err := verify(t, url, source.Ref{Branch: "unsigned"}, source.ModeHEAD, keys)
		assertKind(t, err, source.ErrVerification, "commit "+unsigned, "not signed")
	})
	t.Run("untrusted key", func(t *testing.T) {
		_, _, err := verify(t, url, source.Ref{Branch: "stranger"}, source.ModeHEAD, keys)
		assertKind(t, err, source.ErrVerification, "commit "+stranger, untrusted.Fingerprint, "not a trusted key")
	})
	t.Run("tampered", func(t *testing.T) {
		_, _, err := verify(t, url, source.Ref{Branch: "tampered"}, source.ModeHEAD, keys)
		assertKind(t, err, source.ErrVerification, "commit "+forged, "does not match")
	})
	t.Run("the stranger becomes trusted when added", func(t *testing.T) {
		both := keyRing(t, map[string][]byte{"alice.sshpub": trusted.AuthorizedKey, "bob.sshpub": untrusted.AuthorizedKey})
		_, v, err := verify(t, url, source.Ref{Branch: "stranger"}, source.ModeHEAD, both)
		if err != nil || v.Commit.Entry != "bob.sshpub" {
			t.Fatalf("%+v %v", v, err)
		}
	})
	t.Run("bad mode and no keys", func(t *testing.T) {
		a := fetch(t, source.Options{URL: url, Ref: source.Ref{Branch: "signed"}, AllowFileURLs: true})
		_, err := source.Verify(a, "Everything", keys)
		assertKind(t, err, source.ErrInvalidOptions, "Everything")
		_, err = source.Verify(a, source.ModeHEAD, nil)
		assertKind(t, err, source.ErrInvalidKeys)
		_ = a.Cleanup()
		_, err = source.Verify(a, source.ModeHEAD, keys)
		assertKind(t, err, source.ErrInvalidOptions)
	})
}

func TestVerifyTags(t *testing.T) {
	key, other := sourcetest.NewSSHKey(t), sourcetest.NewSSHKey(t)
	keys := keyRing(t, map[string][]byte{"release.sshpub": key.AuthorizedKey})
	r := sourcetest.NewRepo(t)
	r.WriteFile("a.txt", "1")
	r.Commit("unsigned commit")
	r.TagSigned("v1.0.0", "signed tag on an unsigned commit", key)
	r.TagAnnotated("v1.0.1", "annotated, unsigned")
	r.Tag("v1.0.2") // lightweight
	r.TagSigned("v1.0.3", "signed by another key", other)
	r.WriteFile("a.txt", "2")
	signedCommit := r.CommitSigned("signed commit", key)
	r.TagSigned("v1.1.0", "signed tag on a signed commit", key)
	r.TagSigned("v1.2.0", "to be tampered", key)
	forged := r.TamperTag("v1.2.0")
	url := r.FileURL()

	t.Run("signed tag", func(t *testing.T) {
		a, v, err := verify(t, url, source.Ref{Tag: "v1.0.0"}, source.ModeTag, keys)
		if err != nil {
			t.Fatal(err)
		}
		if v.Tag == nil || v.Commit != nil || v.Tag.Fingerprint != key.Fingerprint || a.Tag != "v1.0.0" {
			t.Fatalf("%+v", v)
		}
	})
	t.Run("TagAndHEAD with an unsigned commit", func(t *testing.T) {
		_, _, err := verify(t, url, source.Ref{Tag: "v1.0.0"}, source.ModeTagAndHEAD, keys)
		assertKind(t, err, source.ErrVerification, "commit", "not signed")
	})
	t.Run("TagAndHEAD both signed, through semver", func(t *testing.T) {
		a, v, err := verify(t, url, source.Ref{SemVer: "~1.1"}, source.ModeTagAndHEAD, keys)
		if err != nil {
			t.Fatal(err)
		}
		if a.Tag != "v1.1.0" || a.Commit != signedCommit || v.Tag == nil || v.Commit == nil {
			t.Fatalf("%+v %+v", a, v)
		}
	})
	t.Run("unsigned annotated tag", func(t *testing.T) {
		_, _, err := verify(t, url, source.Ref{Tag: "v1.0.1"}, source.ModeTag, keys)
		assertKind(t, err, source.ErrVerification, "tag v1.0.1", "not signed")
	})
	t.Run("lightweight tag", func(t *testing.T) {
		_, _, err := verify(t, url, source.Ref{Tag: "v1.0.2"}, source.ModeTag, keys)
		assertKind(t, err, source.ErrVerification, "tag v1.0.2", "lightweight")
	})
	t.Run("tag by an untrusted key", func(t *testing.T) {
		_, _, err := verify(t, url, source.Ref{Tag: "v1.0.3"}, source.ModeTag, keys)
		assertKind(t, err, source.ErrVerification, "tag v1.0.3", other.Fingerprint)
	})
	t.Run("tampered tag", func(t *testing.T) {
		_, _, err := verify(t, url, source.Ref{Tag: "v1.2.0"}, source.ModeTag, keys)
		assertKind(t, err, source.ErrVerification, forged, "does not match")
	})
	t.Run("Tag mode without a tag", func(t *testing.T) {
		_, _, err := verify(t, url, source.Ref{Branch: "main"}, source.ModeTag, keys)
		assertKind(t, err, source.ErrVerification, "needs a tag")
	})
}

func TestVerifyOpenPGP(t *testing.T) {
	gpgKey := sourcetest.NewGPGKey(t, "Release Bot <release@reversi.invalid>")
	sshKey := sourcetest.NewSSHKey(t)
	r := sourcetest.NewRepo(t)
	r.WriteFile("a.txt", "1")
	pgpCommit := r.CommitSigned("signed with gpg", gpgKey)
	r.TagSigned("v1.0.0", "gpg-signed tag", gpgKey)
	r.Branch("pgp")
	r.Checkout("tampered")
	r.WriteFile("a.txt", "2")
	r.CommitSigned("gpg, to be tampered", gpgKey)
	r.TamperCommit("tampered")
	url := r.FileURL()

	mixed := keyRing(t, map[string][]byte{"ops.sshpub": sshKey.AuthorizedKey, "release.asc": gpgKey.ArmoredPublicKey})
	_, v, err := verify(t, url, source.Ref{Tag: "v1.0.0"}, source.ModeTagAndHEAD, mixed)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*source.Signer{v.Commit, v.Tag} {
		if s.Type != source.SignatureOpenPGP || s.Fingerprint != gpgKey.Fingerprint || s.Entry != "release.asc" {
			t.Fatalf("signer %+v, want %s from release.asc", s, gpgKey.Fingerprint)
		}
	}

	sshOnly := keyRing(t, map[string][]byte{"ops.sshpub": sshKey.AuthorizedKey})
	_, _, err = verify(t, url, source.Ref{Branch: "pgp"}, source.ModeHEAD, sshOnly)
	assertKind(t, err, source.ErrVerification, "commit "+pgpCommit, "OpenPGP", "not a trusted key")

	otherGPG := sourcetest.NewGPGKey(t, "Someone Else <else@reversi.invalid>")
	otherOnly := keyRing(t, map[string][]byte{"else.asc": otherGPG.ArmoredPublicKey})
	_, _, err = verify(t, url, source.Ref{Branch: "pgp"}, source.ModeHEAD, otherOnly)
	assertKind(t, err, source.ErrVerification, "not a trusted key", gpgKey.Fingerprint[len(gpgKey.Fingerprint)-16:])

	_, _, err = verify(t, url, source.Ref{Branch: "tampered"}, source.ModeHEAD, mixed)
	assertKind(t, err, source.ErrVerification, "does not verify")
}

// The reconciler's path: fetch over authenticated HTTP (shallow), then verify.
func TestVerifyAfterHTTPFetch(t *testing.T) {
	key := sourcetest.NewSSHKey(t)
	r := sourcetest.NewRepo(t)
	r.WriteFile("a.txt", "1")
	r.CommitSigned("one", key)
	r.WriteFile("a.txt", "2")
	head := r.CommitSigned("two", key)
	srv := sourcetest.ServeHTTP(t, filepath.Dir(r.Dir), sourcetest.HTTPAuth{Username: "u", Password: "p"})
	a, err := source.Fetch(context.Background(), source.Options{URL: srv.RepoURL(t, r.Dir), Ref: source.Ref{Branch: "main"},
		Auth: source.Auth{Username: "u", Password: "p"}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Cleanup()
	v, err := source.Verify(a, source.ModeHEAD, keyRing(t, map[string][]byte{"k.sshpub": key.AuthorizedKey}))
	if err != nil || a.Commit != head || v.Commit.Fingerprint != key.Fingerprint {
		t.Fatalf("%+v %v", v, err)
	}
	var se *source.Error
	if _, err := source.Verify(a, source.ModeTag, keyRing(t, map[string][]byte{"k.sshpub": key.AuthorizedKey})); !errors.As(err, &se) || !strings.Contains(se.Error(), "needs a tag") {
		t.Fatalf("Tag mode on a branch: %v", err)
	}
}
