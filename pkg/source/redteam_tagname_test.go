package source_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/pkg/source"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

// ATTACK (git pusher without keys): a signed tag object is accepted under any ref name. The
// release manager signed v1.0.0 (the loose rules) and later v1.1.0 (the tightening). Push the
// existing v1.0.0 tag object again as refs/tags/v1.9.0 (`git push origin <tag object>:refs/tags/v1.9.0`):
// semver picks v1.9.0 as the highest tag whose signature verifies, although the signed tag
// object says "tag v1.0.0", and the revision shown is v1.9.0@sha1:<the old commit>. On a first
// apply (a new ManifestRegistry or gateway) that serves the old rules; afterwards the
// ancestry check refuses it and the registry is stuck (Ready=False) while a newer trusted
// tag exists. git itself warns about such a tag (`git describe`: "tag 'v1.9.0' is really
// 'v1.0.0' here"); the fix is one comparison: the tag object's name must be the ref's.
func TestSemverTakesASignedTagObjectUnderAnotherName(t *testing.T) {
	key := sourcetest.NewSSHKey(t)
	keys, err := source.ParseKeys(map[string][]byte{"release.sshpub": key.AuthorizedKey})
	if err != nil {
		t.Fatal(err)
	}
	r := sourcetest.NewRepo(t)
	r.WriteFile("reg/rules.yaml", "loose")
	loose := r.Commit("loose rules")
	r.TagSigned("v1.0.0", "release 1.0.0", key)
	r.WriteFile("reg/rules.yaml", "strict")
	strict := r.Commit("strict rules")
	r.TagSigned("v1.1.0", "release 1.1.0", key)

	r.Git("update-ref", "refs/tags/v1.9.0", r.Git("rev-parse", "refs/tags/v1.0.0"))

	o := source.Options{URL: r.FileURL(), AllowFileURLs: true, Path: "reg", Ref: source.Ref{SemVer: ">=1.0.0 <2.0.0"},
		Verify: &source.VerifyOptions{Mode: source.ModeTag, Keys: keys}}
	a := fetch(t, o)
	if _, err := source.Verify(a, source.ModeTag, keys); err != nil {
		t.Fatalf("verify: %v", err)
	}
	if a.Commit == loose {
		t.Fatalf("semver chose %s = the v1.0.0 commit (the signed tag object is named v1.0.0), not v1.1.0 at %s; skipped %+v",
			a.Revision, strict, a.SkippedTags)
	}
}

// The honest path: a signed tag verifies under its own name (nested names included); the
// same tag object under another ref name fails naming both, and semver skips it for the
// highest tag that is published under its own name.
func TestTagObjectNameMustMatchTheRef(t *testing.T) {
	key := sourcetest.NewSSHKey(t)
	keys := keyRing(t, map[string][]byte{"release.sshpub": key.AuthorizedKey})
	r := sourcetest.NewRepo(t)
	r.WriteFile("reg/rules.yaml", "loose")
	loose := r.Commit("loose rules")
	r.TagSigned("v1.0.0", "release 1.0.0", key)
	r.TagSigned("release/v1.0.0", "nested name", key)
	r.Git("update-ref", "refs/tags/v1.9.0", r.Git("rev-parse", "refs/tags/v1.0.0"))
	url := r.FileURL()

	for _, tag := range []string{"v1.0.0", "release/v1.0.0"} {
		a, v, err := verify(t, url, source.Ref{Tag: tag}, source.ModeTag, keys)
		if err != nil {
			t.Fatalf("%s: %v", tag, err)
		}
		if a.Tag != tag || a.Commit != loose || v.Tag == nil {
			t.Fatalf("%s: %+v %+v", tag, a, v)
		}
	}
	_, _, err := verify(t, url, source.Ref{Tag: "v1.9.0"}, source.ModeTag, keys)
	assertKind(t, err, source.ErrVerification, "tag v1.9.0", `named "v1.0.0", not "v1.9.0"`)

	o := source.Options{URL: url, AllowFileURLs: true, Ref: source.Ref{SemVer: ">=1.0.0 <2.0.0"},
		Verify: &source.VerifyOptions{Mode: source.ModeTag, Keys: keys}}
	a := fetch(t, o)
	if a.Tag != "v1.0.0" || len(a.SkippedTags) != 1 || a.SkippedTags[0].Tag != "v1.9.0" ||
		!strings.Contains(a.SkippedTags[0].Reason, `named "v1.0.0"`) {
		t.Fatalf("semver fetched %s, skipped %+v", a.Revision, a.SkippedTags)
	}
	sameRemoteRevision(t, o, a)
}

// ATTACK (git pusher without keys; freeze for good): semver with verified tags tries only the
// MaxTagCandidates (10) highest tags in the range and fails when none of them verifies. The
// release manager signed v1.0.0; push ten unsigned tags above it (v1.0.1 … v1.0.10, on any
// commit — lightweight tags cost nothing): every candidate is refused, the signed v1.0.0 is
// never tried, and Fetch (and RemoteRevision) fail with ErrVerification. The registry is
// Ready=False from then on, so the writers' next signed release (v1.1.0, pushed later) is
// also beaten by ten more unsigned tags above it: updates stop for good.
func TestSemverFrozenByTenUnsignedTagsAboveTheTrustedOne(t *testing.T) {
	_, keys, r, strict := signedRelease(t)
	for i := 1; i <= source.MaxTagCandidates; i++ {
		r.Tag(fmt.Sprintf("v1.0.%d", i))
	}

	o := source.Options{URL: r.FileURL(), AllowFileURLs: true, Path: "reg", Ref: source.Ref{SemVer: ">=1.0.0 <2.0.0"},
		Verify: &source.VerifyOptions{Mode: source.ModeTag, Keys: keys}}
	a, err := source.Fetch(context.Background(), o)
	if err != nil {
		t.Fatalf("%d unsigned tags above the signed v1.0.0 make the fetch fail: %v; the highest tag in range whose signature verifies must be chosen "+
			"whatever the number of unsigned ones above it (bound the work by bytes, e.g. fetch the tag objects of every candidate in one tree:0 pack, "+
			"or keep trying below the first %d)", source.MaxTagCandidates, err, source.MaxTagCandidates)
	}
	defer a.Cleanup()
	if a.Commit != strict || a.Tag != "v1.0.0" {
		t.Fatalf("semver chose %s, want v1.0.0 at %s", a.Revision, strict)
	}
}
