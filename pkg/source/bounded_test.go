package source_test

import (
	"context"
	"io/fs"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/pkg/source"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

const bigBlob = 300 << 20 // 300 MiB of zeros: about 300 KiB once git compresses it

// heapGrowth runs op while a goroutine samples the heap (live and not yet collected
// objects) and returns the peak over the baseline measured after a GC before op, and the
// bytes op allocated in all (which no sampling can miss).
func heapGrowth(t *testing.T, op func()) (peak, allocated uint64) {
	t.Helper()
	samples := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/allocs:bytes"}}
	runtime.GC()
	metrics.Read(samples)
	base, allocBase := samples[0].Value.Uint64(), samples[1].Value.Uint64()
	done, sampled := make(chan struct{}), make(chan uint64)
	go func() {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		var max uint64
		for {
			metrics.Read(s)
			max = maxU(max, s[0].Value.Uint64())
			select {
			case <-done:
				sampled <- max
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()
	op()
	metrics.Read(samples)
	close(done)
	max := maxU(<-sampled, samples[0].Value.Uint64())
	if max > base {
		peak = max - base
	}
	return peak, samples[1].Value.Uint64() - allocBase
}

func maxU(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}

// A commit with a 300 MiB blob of zeros outside Path fetches and reads in bounded memory;
// the same blob inside Path is ErrTooLarge naming it; a server without partial clone sends
// the blob, which the pack scan refuses before anything inflates it.
func TestBigBlobIsNeverInflated(t *testing.T) {
	r := sourcetest.NewRepo(t)
	r.WriteFile("reg/a.yaml", "tool: a\n")
	r.WriteFile("inside/a.yaml", "tool: a\n")
	r.WriteZeros("big.bin", bigBlob)
	r.WriteZeros("inside/big.bin", bigBlob) // the same blob
	head := r.Commit("a release with a big file")
	srv := sourcetest.ServeHTTP(t, filepath.Dir(r.Dir), sourcetest.HTTPAuth{})
	urls := map[string]string{"file": r.FileURL(), "http": srv.RepoURL(t, r.Dir)}
	const limit = 64 << 20

	for _, scheme := range []string{"file", "http"} {
		t.Run("outside Path over "+scheme, func(t *testing.T) {
			var a *source.Artifact
			var files fs.FS
			var err error
			peak, allocated := heapGrowth(t, func() {
				a, err = source.Fetch(context.Background(), source.Options{URL: urls[scheme], Ref: source.Ref{Branch: "main"},
					Path: "reg", AllowFileURLs: true})
				if err == nil {
					files, err = a.FS()
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Cleanup()
			t.Logf("%s: heap peak +%.1f MiB, allocated %.1f MiB", scheme, float64(peak)/(1<<20), float64(allocated)/(1<<20))
			if peak >= limit || allocated >= limit {
				t.Fatalf("the heap grew by %d bytes (allocated %d), want < %d", peak, allocated, limit)
			}
			if a.Commit != head {
				t.Fatalf("commit %s, want %s", a.Commit, head)
			}
			if b, err := fs.ReadFile(files, "reg/a.yaml"); err != nil || string(b) != "tool: a\n" {
				t.Fatalf("reg/a.yaml: %q %v", b, err)
			}
			for _, outside := range []string{"big.bin", "inside", "inside/a.yaml"} {
				if _, err := fs.Stat(files, outside); err == nil {
					t.Fatalf("%s is outside Path but in the FS", outside)
				}
			}
		})
	}

	t.Run("inside Path", func(t *testing.T) {
		a := fetch(t, source.Options{URL: r.FileURL(), Ref: source.Ref{Branch: "main"}, Path: "inside", AllowFileURLs: true})
		_, err := a.FS()
		assertKind(t, err, source.ErrTooLarge, "inside/big.bin", "4 MiB limit", "--source-max-file-bytes")
	})

	t.Run("server that ignores the filter", func(t *testing.T) {
		liar := sourcetest.ServeHTTP(t, filepath.Dir(r.Dir), sourcetest.HTTPAuth{})
		liar.IgnoreFilter()
		var err error
		peak, allocated := heapGrowth(t, func() {
			_, err = source.Fetch(context.Background(), source.Options{URL: liar.RepoURL(t, r.Dir), Ref: source.Ref{Branch: "main"},
				Path: "reg", TempDir: t.TempDir()})
		})
		t.Logf("heap peak +%.1f MiB, allocated %.1f MiB", float64(peak)/(1<<20), float64(allocated)/(1<<20))
		assertKind(t, err, source.ErrTooLarge, "blob of 300 MiB", "4 MiB limit")
		if peak >= limit || allocated >= limit {
			t.Fatalf("the heap grew by %d bytes (allocated %d), want < %d", peak, allocated, limit)
		}
	})

	t.Run("server without partial clone", func(t *testing.T) {
		r.DisallowFilter()
		defer r.Git("config", "uploadpack.allowFilter", "true")
		for _, scheme := range []string{"file", "http"} {
			var err error
			peak, allocated := heapGrowth(t, func() {
				_, err = source.Fetch(context.Background(), source.Options{URL: urls[scheme], Ref: source.Ref{Branch: "main"},
					Path: "reg", AllowFileURLs: true, TempDir: t.TempDir()})
			})
			t.Logf("%s: heap peak +%.1f MiB, allocated %.1f MiB", scheme, float64(peak)/(1<<20), float64(allocated)/(1<<20))
			assertKind(t, err, source.ErrTooLarge, "blob of 300 MiB", "4 MiB limit", "uploadpack.allowFilter")
			if peak >= limit || allocated >= limit {
				t.Fatalf("the heap grew by %d bytes (allocated %d), want < %d", peak, allocated, limit)
			}
		}
	})
}

func TestFSLimits(t *testing.T) {
	r := sourcetest.NewRepo(t)
	r.WriteFile("reg/a.yaml", strings.Repeat("a", 600))
	r.WriteFile("reg/b.yaml", strings.Repeat("b", 600))
	r.WriteFile("reg/c/big.yaml", strings.Repeat("c", 2000))
	r.WriteFile("reg/d/small.yaml", "d")
	r.Commit("files")
	url := r.FileURL()

	a := fetch(t, source.Options{URL: url, Ref: source.Ref{Branch: "main"}, Path: "./reg/d/", AllowFileURLs: true, MaxFileBytes: 1000})
	files, err := a.FS()
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{".", "reg", "reg/d"} {
		if fi, err := fs.Stat(files, dir); err != nil || !fi.IsDir() {
			t.Fatalf("%s: %v %v", dir, fi, err)
		}
	}
	if entries, _ := fs.ReadDir(files, "reg"); len(entries) != 1 || entries[0].Name() != "d" {
		t.Fatalf("reg lists %v, want only d", entries)
	}

	a = fetch(t, source.Options{URL: url, Ref: source.Ref{Branch: "main"}, Path: "reg", AllowFileURLs: true, MaxFileBytes: 1000})
	_, err = a.FS()
	assertKind(t, err, source.ErrTooLarge, "reg/c/big.yaml", "1000 bytes limit", "filter left it out")

	// Files with the same content are one object in the pack, but count once each.
	dup := sourcetest.NewRepo(t)
	for _, name := range []string{"1", "2", "3", "4"} {
		dup.WriteFile("dup/"+name+".yaml", strings.Repeat("x", 600))
	}
	dup.Commit("copies")
	a = fetch(t, source.Options{URL: dup.FileURL(), Ref: source.Ref{Branch: "main"}, Path: "dup", AllowFileURLs: true, MaxTotalBytes: 2000})
	_, err = a.FS()
	assertKind(t, err, source.ErrTooLarge, "under dup", "2000 bytes limit", "--source-max-total-bytes")

	a = fetch(t, source.Options{URL: url, Ref: source.Ref{Branch: "main"}, Path: "absent", AllowFileURLs: true})
	files, err = a.FS()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Stat(files, "absent"); err == nil {
		t.Fatal("a missing Path is in the FS")
	}

	// The pack itself is bounded too: its objects' sum, and their count.
	_, err = source.Fetch(context.Background(), source.Options{URL: url, Ref: source.Ref{Branch: "main"}, AllowFileURLs: true, MaxTotalBytes: 2000})
	assertKind(t, err, source.ErrTooLarge, "total more than the 2000 bytes limit")
	_, err = source.Fetch(context.Background(), source.Options{URL: url, Ref: source.Ref{Branch: "main"}, AllowFileURLs: true, MaxObjects: 3})
	assertKind(t, err, source.ErrTooLarge, "objects", "limit of 3")
}

// chain is a repository whose main branch has an unsigned commit under a signed head, a
// branch where every commit is signed, and one that merges an unsigned side branch.
type chain struct {
	repo                           *sourcetest.Repo
	trusted                        *sourcetest.SSHKey
	keys                           *source.KeyRing
	base, unsigned, head           string
	signedHead, merged, sideCommit string
}

func newChain(t *testing.T) *chain {
	c := &chain{repo: sourcetest.NewRepo(t), trusted: sourcetest.NewSSHKey(t)}
	c.keys = keyRing(t, map[string][]byte{"alice.sshpub": c.trusted.AuthorizedKey})
	r := c.repo
	r.WriteFile("reg/v.txt", "1")
	c.base = r.CommitSigned("base", c.trusted)
	r.Branch("base")

	r.Checkout("signed")
	r.WriteFile("reg/v.txt", "2s")
	r.CommitSigned("signed two", c.trusted)
	r.WriteFile("reg/v.txt", "3s")
	c.signedHead = r.CommitSigned("signed three", c.trusted)

	r.Checkout("side")
	r.Git("reset", "-q", "--hard", c.base)
	r.WriteFile("side.txt", "x")
	c.sideCommit = r.Commit("sneak in an unsigned change")
	r.Checkout("merged")
	r.Git("reset", "-q", "--hard", c.signedHead)
	args := append(c.trusted.GitArgs(), "merge", "-q", "--no-ff", "-S", "-m", "merge side", "side")
	r.Git(args...)
	c.merged = r.Rev("HEAD")

	r.Checkout("main")
	r.WriteFile("reg/v.txt", "2")
	c.unsigned = r.Commit("unsigned change to the rules")
	r.WriteFile("reg/v.txt", "3")
	c.head = r.CommitSigned("signed on top", c.trusted)
	return c
}

func TestVerifyChain(t *testing.T) {
	c := newChain(t)
	srv := sourcetest.ServeHTTP(t, filepath.Dir(c.repo.Dir), sourcetest.HTTPAuth{})
	for scheme, url := range map[string]string{"file": c.repo.FileURL(), "http": srv.RepoURL(t, c.repo.Dir)} {
		t.Run(scheme, func(t *testing.T) {
			get := func(branch, since string) *source.Artifact {
				return fetch(t, source.Options{URL: url, Ref: source.Ref{Branch: branch}, Since: since, AllowFileURLs: true})
			}

			a := get("main", c.base)
			_, err := source.Verify(a, source.ModeChain, c.keys)
			assertKind(t, err, source.ErrVerification, "commit "+c.unsigned[:12], `"unsigned change to the rules"`, "not signed", "mode Chain")
			// Flux's behaviour: HEAD only.
			if v, err := source.Verify(a, source.ModeHEAD, c.keys); err != nil || v.Commit == nil {
				t.Fatalf("HEAD mode: %+v %v", v, err)
			}

			v, err := source.Verify(get("signed", c.base), source.ModeChain, c.keys)
			if err != nil || v.Chain != 2 || v.Commit.Fingerprint != c.trusted.Fingerprint {
				t.Fatalf("all-signed chain: %+v %v", v, err)
			}

			_, err = source.Verify(get("merged", c.base), source.ModeChain, c.keys)
			assertKind(t, err, source.ErrVerification, "commit "+c.sideCommit[:12], "sneak in", "not signed")
			// Since the signed head, only the merge and the side branch are new.
			_, err = source.Verify(get("merged", c.signedHead), source.ModeChain, c.keys)
			assertKind(t, err, source.ErrVerification, "commit "+c.sideCommit[:12])

			// A first apply trusts the history: only HEAD is verified.
			v, err = source.Verify(get("main", ""), source.ModeChain, c.keys)
			if err != nil || v.Chain != 1 {
				t.Fatalf("first apply: %+v %v", v, err)
			}
			// Nothing new since the head.
			if v, err := source.Verify(get("main", c.head), source.ModeChain, c.keys); err != nil || v.Chain != 1 {
				t.Fatalf("since the head itself: %+v %v", v, err)
			}
		})
	}

	t.Run("history longer than MaxCommits", func(t *testing.T) {
		// One commit deep: the head and the hashes of its parents.
		a := fetch(t, source.Options{URL: c.repo.FileURL(), Ref: source.Ref{Branch: "main"}, Since: c.base, MaxCommits: 1, AllowFileURLs: true})
		_, err := source.Verify(a, source.ModeChain, c.keys)
		assertKind(t, err, source.ErrVerification, "mode Chain cannot check every commit since "+c.base[:12], "1 commits deep")
		_, err = a.Descends(c.base)
		assertKind(t, err, source.ErrTooLarge, "does not reach "+c.base[:12])
		if ok, err := a.Descends(c.unsigned); err != nil || !ok {
			t.Fatalf("Descends(the parent): %v %v", ok, err)
		}
		// Two deep reaches the parent that is Since.
		a = fetch(t, source.Options{URL: c.repo.FileURL(), Ref: source.Ref{Branch: "main"}, Since: c.base, MaxCommits: 2, AllowFileURLs: true})
		if ok, err := a.Descends(c.base); err != nil || !ok {
			t.Fatalf("Descends(since) two deep: %v %v", ok, err)
		}
	})
}

func TestDescends(t *testing.T) {
	r := sourcetest.NewRepo(t)
	r.WriteFile("reg/v.txt", "1")
	one := r.Commit("one")
	r.WriteFile("reg/v.txt", "2")
	two := r.Commit("two")
	r.WriteFile("reg/v.txt", "3")
	three := r.Commit("three")
	srv := sourcetest.ServeHTTP(t, filepath.Dir(r.Dir), sourcetest.HTTPAuth{})
	urls := map[string]string{"file": r.FileURL(), "http": srv.RepoURL(t, r.Dir)}
	get := func(t *testing.T, url, since string) *source.Artifact {
		return fetch(t, source.Options{URL: url, Ref: source.Ref{Branch: "main"}, Since: since, AllowFileURLs: true})
	}
	descends := func(t *testing.T, a *source.Artifact, commit string, want bool) {
		t.Helper()
		got, err := a.Descends(commit)
		if err != nil || got != want {
			t.Fatalf("%s descends from %s: %v %v, want %v", a.Commit[:12], commit[:12], got, err, want)
		}
	}

	for scheme, url := range urls {
		t.Run(scheme, func(t *testing.T) {
			a := get(t, url, one)
			if a.Commit != three || a.Since != one {
				t.Fatalf("commit %s since %s", a.Commit, a.Since)
			}
			descends(t, a, one, true)
			descends(t, a, two, true)
			descends(t, a, three, true)
			descends(t, a, strings.Repeat("ab", 20), false)

			// Without Since no history is fetched: only the commit itself is known.
			a = get(t, url, "")
			descends(t, a, three, true)
			_, err := a.Descends(one)
			assertKind(t, err, source.ErrTooLarge, "not fetched")
			_, err = a.Descends("nope")
			assertKind(t, err, source.ErrInvalidOptions)
		})
	}

	// A force-push to an older commit, then to an unrelated history.
	r.Git("reset", "-q", "--hard", one)
	for _, url := range urls {
		a := get(t, url, three)
		if a.Commit != one {
			t.Fatalf("commit %s, want %s", a.Commit, one)
		}
		descends(t, a, three, false)
		descends(t, a, one, true)
	}
	r.Git("checkout", "-q", "--orphan", "unrelated")
	r.WriteFile("reg/v.txt", "other")
	other := r.Commit("unrelated")
	r.Git("branch", "-f", "main", other)
	for _, url := range urls {
		a := get(t, url, three)
		if a.Commit != other {
			t.Fatalf("commit %s, want %s", a.Commit, other)
		}
		descends(t, a, three, false)
		descends(t, a, one, false)
	}
}

func TestSemverSkipsUntrustedTags(t *testing.T) {
	trusted, stranger := sourcetest.NewSSHKey(t), sourcetest.NewSSHKey(t)
	keys := keyRing(t, map[string][]byte{"release.sshpub": trusted.AuthorizedKey})
	r := sourcetest.NewRepo(t)
	r.WriteFile("reg/v.txt", "1.0")
	r.CommitSigned("one", trusted)
	r.TagSigned("v1.0.0", "release 1.0.0", trusted)
	r.WriteFile("reg/v.txt", "1.1")
	good := r.CommitSigned("one one", trusted)
	r.TagSigned("v1.1.0", "release 1.1.0", trusted)
	r.WriteFile("reg/v.txt", "1.2")
	r.Commit("unsigned one two")
	r.TagSigned("v1.2.0", "signed tag, unsigned commit", trusted)
	r.WriteFile("reg/v.txt", "1.3")
	r.CommitSigned("one three", stranger)
	r.TagSigned("v1.3.0", "release by someone else", stranger)
	r.WriteFile("reg/v.txt", "1.4")
	r.Commit("one four")
	r.Tag("v1.4.0") // lightweight
	r.WriteFile("reg/v.txt", "2.0")
	r.CommitSigned("two", trusted)
	r.TagSigned("v2.0.0", "out of range", trusted)
	srv := sourcetest.ServeHTTP(t, filepath.Dir(r.Dir), sourcetest.HTTPAuth{})

	for scheme, url := range map[string]string{"file": r.FileURL(), "http": srv.RepoURL(t, r.Dir)} {
		t.Run(scheme, func(t *testing.T) {
			o := source.Options{URL: url, Ref: source.Ref{SemVer: "1.x"}, AllowFileURLs: true, Path: "reg",
				Verify: &source.VerifyOptions{Mode: source.ModeTagAndHEAD, Keys: keys}}
			a := fetch(t, o)
			if a.Tag != "v1.1.0" || a.Commit != good {
				t.Fatalf("fetched %s (%s), want v1.1.0 (%s)", a.Tag, a.Commit, good)
			}
			if got := readFile(t, a, "reg/v.txt"); got != "1.1" {
				t.Fatalf("reg/v.txt = %q", got)
			}
			if _, err := source.Verify(a, source.ModeTagAndHEAD, keys); err != nil {
				t.Fatal(err)
			}
			want := []struct{ tag, why string }{
				{"v1.4.0", "lightweight"},
				{"v1.3.0", stranger.Fingerprint + ", which is not a trusted key"},
				{"v1.2.0", "not signed"},
			}
			if len(a.SkippedTags) != len(want) {
				t.Fatalf("skipped %+v", a.SkippedTags)
			}
			for i, w := range want {
				if s := a.SkippedTags[i]; s.Tag != w.tag || !strings.Contains(s.Reason, w.why) {
					t.Errorf("skipped[%d] = %+v, want %s (%s)", i, s, w.tag, w.why)
				}
			}
			rev, err := source.RemoteRevision(context.Background(), o)
			if err != nil || rev != a.Revision {
				t.Fatalf("RemoteRevision %q %v, want %q", rev, err, a.Revision)
			}

			// Tag mode ignores the commits' signatures: v1.2.0 is the highest signed tag.
			o.Verify.Mode = source.ModeTag
			if a := fetch(t, o); a.Tag != "v1.2.0" || len(a.SkippedTags) != 2 {
				t.Fatalf("Tag mode fetched %s, skipped %+v", a.Tag, a.SkippedTags)
			}
			// Modes that do not verify tags take the highest tag, as before.
			o.Verify.Mode = source.ModeHEAD
			if a := fetch(t, o); a.Tag != "v1.4.0" || a.SkippedTags != nil {
				t.Fatalf("HEAD mode fetched %s, skipped %+v", a.Tag, a.SkippedTags)
			}
			// No candidate verifies.
			o.Verify.Mode = source.ModeTag
			o.Ref.SemVer = ">=1.3.0 <2.0.0"
			_, err = source.Fetch(context.Background(), o)
			assertKind(t, err, source.ErrVerification, "no tag matching", "v1.4.0: ", "v1.3.0: ")
		})
	}
}
