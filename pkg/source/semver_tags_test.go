package source_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/pkg/source"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

// tagNames is prefix1 … prefixN.
func tagNames(prefix string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s%d", prefix, i+1)
	}
	return names
}

// The honest path under a flood: hundreds of unsigned annotated tags, lightweight tags, a
// tag by an untrusted key and a trusted tag object replayed under a higher name all lie
// above the trusted v1.1.0. Semver takes v1.1.0 (not the lower trusted v1.0.0), in three
// tag requests (batches of 16, 64, 256), lists the 20 highest skipped tags and counts the
// others, and RemoteRevision agrees.
func TestSemverChoosesTheHighestTrustedTagBelowManyBadOnes(t *testing.T) {
	trusted, stranger := sourcetest.NewSSHKey(t), sourcetest.NewSSHKey(t)
	keys := keyRing(t, map[string][]byte{"release.sshpub": trusted.AuthorizedKey})
	r := sourcetest.NewRepo(t)
	r.WriteFile("reg/rules.yaml", "old")
	r.Commit("old rules")
	r.TagSigned("v1.0.0", "release 1.0.0", trusted)
	r.WriteFile("reg/rules.yaml", "strict")
	strict := r.Commit("strict rules")
	r.TagSigned("v1.1.0", "release 1.1.0", trusted)
	r.WriteFile("reg/rules.yaml", "loose")
	r.Commit("loose rules")
	r.TagAnnotatedMany(tagNames("v1.1.", 300), "not a release")
	for _, name := range tagNames("v1.2.", 30) {
		r.Tag(name)
	}
	r.TagSigned("v1.3.0", "release by someone else", stranger)
	r.Git("update-ref", "refs/tags/v1.4.0", r.Git("rev-parse", "refs/tags/v1.1.0"))
	const bad = 300 + 30 + 1 + 1
	srv := sourcetest.ServeHTTP(t, filepath.Dir(r.Dir), sourcetest.HTTPAuth{})

	for scheme, url := range map[string]string{"file": r.FileURL(), "http": srv.RepoURL(t, r.Dir)} {
		t.Run(scheme, func(t *testing.T) {
			o := source.Options{URL: url, AllowFileURLs: true, Path: "reg", Ref: source.Ref{SemVer: ">=1.0.0 <2.0.0"},
				Verify: &source.VerifyOptions{Mode: source.ModeTag, Keys: keys}}
			before := srv.Fetches()
			a := fetch(t, o)
			if a.Tag != "v1.1.0" || a.Commit != strict {
				t.Fatalf("semver chose %s, want v1.1.0 at %s", a.Revision, strict)
			}
			if got := readFile(t, a, "reg/rules.yaml"); got != "strict" {
				t.Fatalf("reg/rules.yaml = %q", got)
			}
			if _, err := source.Verify(a, source.ModeTag, keys); err != nil {
				t.Fatal(err)
			}
			if scheme == "http" {
				// 303 annotated candidates down to v1.1.0: batches of 16, 64 and 256, then the content.
				if n := srv.Fetches() - before; n != 4 {
					t.Errorf("%d upload-pack requests, want 3 for the tags and 1 for the content", n)
				}
			}
			if len(a.SkippedTags) != source.MaxSkippedTags || a.SkippedTagsOmitted != bad-source.MaxSkippedTags {
				t.Fatalf("%d skipped tags listed, %d omitted; want %d and %d", len(a.SkippedTags), a.SkippedTagsOmitted,
					source.MaxSkippedTags, bad-source.MaxSkippedTags)
			}
			want := []struct{ tag, why string }{
				{"v1.4.0", `named "v1.1.0"`},
				{"v1.3.0", stranger.Fingerprint + ", which is not a trusted key"},
				{"v1.2.30", "lightweight"},
			}
			for i, w := range want {
				if s := a.SkippedTags[i]; s.Tag != w.tag || !strings.Contains(s.Reason, w.why) {
					t.Errorf("skipped[%d] = %+v, want %s (%s)", i, s, w.tag, w.why)
				}
			}
			if last := a.SkippedTags[len(a.SkippedTags)-1]; last.Tag != "v1.2.13" {
				t.Errorf("last listed skipped tag %+v, want v1.2.13", last)
			}
			sameRemoteRevision(t, o, a)
		})
	}
}

// Tag objects that make a batch's pack break the limits do not freeze semver either: the
// batch is fetched again in halves, and a tag whose own object is over MaxFileBytes is
// skipped, saying so.
func TestSemverSplitsTagBatchesOverTheLimits(t *testing.T) {
	_, keys, r, strict := signedRelease(t)
	r.TagAnnotatedMany(tagNames("v1.0.", 40), strings.Repeat("twelve KiB ", 12<<10/11)) // 480 KiB in all
	r.TagAnnotatedMany([]string{"v1.1.0"}, strings.Repeat("x", 20<<10))                 // over MaxFileBytes
	srv := sourcetest.ServeHTTP(t, filepath.Dir(r.Dir), sourcetest.HTTPAuth{})

	for scheme, url := range map[string]string{"file": r.FileURL(), "http": srv.RepoURL(t, r.Dir)} {
		t.Run(scheme, func(t *testing.T) {
			o := source.Options{URL: url, AllowFileURLs: true, Path: "reg", Ref: source.Ref{SemVer: "1.x"},
				MaxFileBytes: 16 << 10, MaxTotalBytes: 128 << 10,
				Verify: &source.VerifyOptions{Mode: source.ModeTag, Keys: keys}}
			before := srv.Fetches()
			a := fetch(t, o)
			if a.Tag != "v1.0.0" || a.Commit != strict {
				t.Fatalf("semver chose %s, want v1.0.0 at %s", a.Revision, strict)
			}
			if scheme == "http" {
				t.Logf("%d upload-pack requests", srv.Fetches()-before)
			}
			if s := a.SkippedTags[0]; s.Tag != "v1.1.0" || !strings.Contains(s.Reason, "cannot be fetched within the limits") ||
				!strings.Contains(s.Reason, "16 KiB") {
				t.Fatalf("skipped[0] = %+v", s)
			}
			if n := len(a.SkippedTags) + a.SkippedTagsOmitted; n != 41 {
				t.Fatalf("%d tags skipped, want 41: %+v", n, a.SkippedTags)
			}
			for _, s := range a.SkippedTags[1:] {
				if !strings.Contains(s.Reason, "not signed") {
					t.Fatalf("skipped %+v, want not signed", s)
				}
			}
			sameRemoteRevision(t, o, a)
		})
	}
}

// The bound: the MaxTagCandidates highest annotated tags are tried (lightweight ones do not
// count), so a trusted tag that is the MaxTagCandidates-th is chosen; one more unsigned
// annotated tag above it and Fetch and RemoteRevision fail with ErrTooLarge naming the
// limit.
func TestSemverTriesAtMostMaxTagCandidatesAnnotatedTags(t *testing.T) {
	_, keys, r, strict := signedRelease(t)
	r.Commit("junk")
	r.TagAnnotatedMany(tagNames("v1.0.", source.MaxTagCandidates-1), "not a release")
	for _, name := range tagNames("v1.1.", 30) {
		r.Tag(name)
	}
	o := source.Options{URL: r.FileURL(), AllowFileURLs: true, Path: "reg", Ref: source.Ref{SemVer: "1.x"},
		Verify: &source.VerifyOptions{Mode: source.ModeTag, Keys: keys}}

	a := fetch(t, o)
	if a.Tag != "v1.0.0" || a.Commit != strict {
		t.Fatalf("semver chose %s, want v1.0.0 at %s", a.Revision, strict)
	}
	if n := len(a.SkippedTags) + a.SkippedTagsOmitted; n != source.MaxTagCandidates-1+30 {
		t.Fatalf("%d tags skipped", n)
	}
	sameRemoteRevision(t, o, a)

	r.TagAnnotatedMany([]string{fmt.Sprintf("v1.0.%d", source.MaxTagCandidates)}, "one more")
	_, err := source.Fetch(context.Background(), o)
	words := []string{fmt.Sprintf("none of the %d highest annotated tags", source.MaxTagCandidates),
		"1 lower annotated tag(s) are not tried", "MaxTagCandidates", "v1.1.30: ", "more tags"}
	assertKind(t, err, source.ErrTooLarge, words...)
	if len(err.Error()) > 16<<10 {
		t.Fatalf("the error is %d bytes long", len(err.Error()))
	}
	_, err = source.RemoteRevision(context.Background(), o)
	assertKind(t, err, source.ErrTooLarge, words...)
}

// signedRelease is a repository whose commit strict (reg/rules.yaml) is tagged v1.0.0, signed
// by key; keys trusts key.
func signedRelease(t *testing.T) (key *sourcetest.SSHKey, keys *source.KeyRing, r *sourcetest.Repo, strict string) {
	t.Helper()
	key = sourcetest.NewSSHKey(t)
	keys = keyRing(t, map[string][]byte{"release.sshpub": key.AuthorizedKey})
	r = sourcetest.NewRepo(t)
	r.WriteFile("reg/rules.yaml", "strict")
	strict = r.Commit("strict rules")
	r.TagSigned("v1.0.0", "release 1.0.0", key)
	return key, keys, r, strict
}

// sameRemoteRevision fails unless RemoteRevision says what Fetch fetched (a).
func sameRemoteRevision(t *testing.T, o source.Options, a *source.Artifact) {
	t.Helper()
	if rev, err := source.RemoteRevision(context.Background(), o); err != nil || rev != a.Revision {
		t.Fatalf("RemoteRevision %q %v, want %q", rev, err, a.Revision)
	}
}
