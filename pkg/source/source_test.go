package source_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/pkg/source"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
	"golang.org/x/crypto/ssh/knownhosts"
)

// fetch fetches and registers the artifact's cleanup.
func fetch(t *testing.T, o source.Options) *source.Artifact {
	t.Helper()
	a, err := source.Fetch(context.Background(), o)
	if err != nil {
		t.Fatalf("Fetch(%s, %+v): %v", o.URL, o.Ref, err)
	}
	t.Cleanup(func() { _ = a.Cleanup() })
	return a
}

// readFile reads path from the artifact's files (FS).
func readFile(t *testing.T, a *source.Artifact, path string) string {
	t.Helper()
	files, err := a.FS()
	if err != nil {
		t.Fatal(err)
	}
	b, err := fs.ReadFile(files, path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// assertKind checks err matches kind and that its message mentions each of words.
func assertKind(t *testing.T, err, kind error, words ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want %v, got no error", kind)
	}
	if !errors.Is(err, kind) {
		t.Fatalf("want %v, got %v", kind, err)
	}
	var se *source.Error
	if !errors.As(err, &se) {
		t.Fatalf("error %v is not a *source.Error", err)
	}
	t.Logf("%v", err)
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

// history is a repository with branches, lightweight, annotated and pre-release tags.
type history struct {
	repo                          *sourcetest.Repo
	c1, c2, c3, dev, head, rcHead string
}

func newHistory(t *testing.T) *history {
	h := &history{repo: sourcetest.NewRepo(t)}
	r := h.repo
	r.WriteFile("m/v.txt", "one")
	h.c1 = r.Commit("one")
	r.Tag("v1.0.0") // lightweight
	r.WriteFile("m/v.txt", "two")
	h.c2 = r.Commit("two")
	r.TagAnnotated("v1.1.0", "release 1.1.0")
	r.Tag("not-a-version")
	r.WriteFile("m/v.txt", "three")
	h.c3 = r.Commit("three")
	r.TagAnnotated("v2.0.0", "release 2.0.0")
	r.Checkout("dev")
	r.WriteFile("m/v.txt", "dev")
	h.dev = r.Commit("dev work")
	r.TagAnnotated("v2.1.0-rc.1", "release candidate")
	r.Checkout("main")
	r.WriteFile("m/v.txt", "four")
	h.head = r.Commit("four")
	return h
}

func TestFetchEveryRefKindOverFile(t *testing.T) {
	h := newHistory(t)
	url := h.repo.FileURL()
	cases := []struct {
		name     string
		ref      source.Ref
		revision string
		commit   string
		tag      string
		content  string
	}{
		{"branch main", source.Ref{Branch: "main"}, "main@sha1:" + h.head, h.head, "", "four"},
		{"branch dev", source.Ref{Branch: "dev"}, "dev@sha1:" + h.dev, h.dev, "", "dev"},
		{"lightweight tag", source.Ref{Tag: "v1.0.0"}, "v1.0.0@sha1:" + h.c1, h.c1, "v1.0.0", "one"},
		{"annotated tag peels to the commit", source.Ref{Tag: "v1.1.0"}, "v1.1.0@sha1:" + h.c2, h.c2, "v1.1.0", "two"},
		{"semver within 1.x picks the highest 1.x", source.Ref{SemVer: ">=1.0.0 <2.0.0"}, "v1.1.0@sha1:" + h.c2, h.c2, "v1.1.0", "two"},
		{"semver open range skips the pre-release", source.Ref{SemVer: ">=1.0.0"}, "v2.0.0@sha1:" + h.c3, h.c3, "v2.0.0", "three"},
		{"semver naming a pre-release takes it", source.Ref{SemVer: ">=2.1.0-rc.0"}, "v2.1.0-rc.1@sha1:" + h.dev, h.dev, "v2.1.0-rc.1", "dev"},
		{"semver tilde", source.Ref{SemVer: "~1.0"}, "v1.0.0@sha1:" + h.c1, h.c1, "v1.0.0", "one"},
		{"bare commit", source.Ref{Commit: h.c2}, "sha1:" + h.c2, h.c2, "", "two"},
		{"upper-case commit on a branch", source.Ref{Commit: strings.ToUpper(h.c1), Branch: "main"}, "main@sha1:" + h.c1, h.c1, "", "one"},
		{"commit only on another branch", source.Ref{Commit: h.dev}, "sha1:" + h.dev, h.dev, "", "dev"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := source.Options{URL: url, Ref: tc.ref, TempDir: t.TempDir(), AllowFileURLs: true}
			a := fetch(t, o)
			if a.Revision != tc.revision || a.Commit != tc.commit || a.Tag != tc.tag {
				t.Fatalf("got revision %q commit %q tag %q, want %q %q %q", a.Revision, a.Commit, a.Tag, tc.revision, tc.commit, tc.tag)
			}
			if got := readFile(t, a, "m/v.txt"); got != tc.content {
				t.Fatalf("worktree has %q, want %q", got, tc.content)
			}
			rev, err := source.RemoteRevision(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			if rev != a.Revision {
				t.Fatalf("RemoteRevision %q != fetched %q", rev, a.Revision)
			}
			dir := a.Dir
			if err := a.Cleanup(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Fatalf("Cleanup left %s: %v", dir, err)
			}
		})
	}
}

func TestFetchBranchIsShallow(t *testing.T) {
	h := newHistory(t)
	a := fetch(t, source.Options{URL: h.repo.FileURL(), Ref: source.Ref{Branch: "main"}, AllowFileURLs: true})
	shallow, err := os.ReadFile(filepath.Join(a.Dir, ".git", "shallow"))
	if err != nil {
		t.Fatalf("a branch fetch should be shallow: %v", err)
	}
	if strings.TrimSpace(string(shallow)) != h.head {
		t.Fatalf(".git/shallow = %q, want the head %s", shallow, h.head)
	}
}

func TestRemoteRevisionFollowsNewCommits(t *testing.T) {
	h := newHistory(t)
	o := source.Options{URL: h.repo.FileURL(), Ref: source.Ref{Branch: "main"}, AllowFileURLs: true}
	before, err := source.RemoteRevision(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	h.repo.WriteFile("m/v.txt", "five")
	next := h.repo.Commit("five")
	after, err := source.RemoteRevision(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if before != "main@sha1:"+h.head || after != "main@sha1:"+next {
		t.Fatalf("revisions %q then %q", before, after)
	}
}

func TestRefNotFoundLeavesNothingBehind(t *testing.T) {
	h := newHistory(t)
	missing := strings.Repeat("ab", 20)
	cases := []struct {
		name  string
		ref   source.Ref
		words []string
	}{
		{"branch", source.Ref{Branch: "nope"}, []string{"nope"}},
		{"tag", source.Ref{Tag: "v9.9.9"}, []string{"v9.9.9"}},
		{"semver", source.Ref{SemVer: ">=5.0.0"}, []string{">=5.0.0"}},
		{"commit", source.Ref{Commit: missing}, []string{missing}},
		{"commit on a branch it is not on", source.Ref{Commit: h.dev, Branch: "main"}, []string{h.dev, "main"}},
		{"commit on a missing branch", source.Ref{Commit: h.c1, Branch: "gone"}, []string{"gone"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			o := source.Options{URL: h.repo.FileURL(), Ref: tc.ref, TempDir: tmp, AllowFileURLs: true}
			_, err := source.Fetch(context.Background(), o)
			assertKind(t, err, source.ErrRefNotFound, tc.words...)
			entries, _ := os.ReadDir(tmp)
			if len(entries) != 0 {
				t.Fatalf("failed fetch left %d entries in TempDir", len(entries))
			}
			if tc.ref.Commit == "" || tc.ref.Branch != "" && tc.ref.Branch != "main" {
				_, err := source.RemoteRevision(context.Background(), o)
				assertKind(t, err, source.ErrRefNotFound)
			}
		})
	}
}

func TestEmptyAndMissingRepositories(t *testing.T) {
	empty := sourcetest.NewRepo(t)
	_, err := source.Fetch(context.Background(), source.Options{URL: empty.FileURL(), Ref: source.Ref{Branch: "main"}, AllowFileURLs: true})
	assertKind(t, err, source.ErrRefNotFound)

	_, err = source.RemoteRevision(context.Background(), source.Options{URL: "file://" + t.TempDir() + "/absent", Ref: source.Ref{Branch: "main"}, AllowFileURLs: true})
	assertKind(t, err, source.ErrRepositoryNotFound)
}

func TestInvalidOptionsAreRefusedBeforeAnyNetwork(t *testing.T) {
	key := sourcetest.NewSSHKey(t)
	commit := strings.Repeat("0", 40)
	main := source.Ref{Branch: "main"}
	cases := []struct {
		name  string
		o     source.Options
		words []string
	}{
		{"no url", source.Options{Ref: main}, []string{"url"}},
		{"no ref", source.Options{URL: "https://example.invalid/r.git"}, []string{"exactly one"}},
		{"two refs", source.Options{URL: "https://example.invalid/r.git", Ref: source.Ref{Branch: "main", Tag: "v1"}}, []string{"exactly one"}},
		{"short commit", source.Options{URL: "https://example.invalid/r.git", Ref: source.Ref{Commit: "abc123"}}, []string{"40"}},
		{"bad semver", source.Options{URL: "https://example.invalid/r.git", Ref: source.Ref{SemVer: "not a range"}}, []string{"semver"}},
		{"bad branch name", source.Options{URL: "https://example.invalid/r.git", Ref: source.Ref{Branch: "a..b"}}, []string{"branch"}},
		{"scp-like address", source.Options{URL: "git@example.invalid:org/r.git", Ref: main}, []string{"ssh://"}},
		{"unsupported scheme", source.Options{URL: "ftp://example.invalid/r.git", Ref: main}, []string{"ftp"}},
		{"credentials in the url", source.Options{URL: "https://u:secret@example.invalid/r.git", Ref: main}, []string{"secret", "xxxxx"}},
		{"token and basic", source.Options{URL: "https://example.invalid/r.git", Ref: main,
			Auth: source.Auth{Username: "u", Password: "p", BearerToken: "t"}}, []string{"bearerToken"}},
		{"username without password", source.Options{URL: "https://example.invalid/r.git", Ref: main,
			Auth: source.Auth{Username: "u"}}, []string{"password"}},
		{"identity over https", source.Options{URL: "https://example.invalid/r.git", Ref: main,
			Auth: source.Auth{Identity: key.PrivateKey}}, []string{"ssh"}},
		{"ssh without known_hosts", source.Options{URL: "ssh://git@example.invalid/r.git", Ref: main,
			Auth: source.Auth{Identity: key.PrivateKey}}, []string{"known_hosts"}},
		{"ssh without identity", source.Options{URL: "ssh://git@example.invalid/r.git", Ref: main,
			Auth: source.Auth{KnownHosts: []byte("example.invalid " + string(key.AuthorizedKey))}}, []string{"identity"}},
		{"ssh with a garbage identity", source.Options{URL: "ssh://git@example.invalid/r.git", Ref: main,
			Auth: source.Auth{Identity: []byte("garbage"), KnownHosts: []byte("example.invalid " + string(key.AuthorizedKey))}}, []string{"identity"}},
		{"ssh with garbage known_hosts", source.Options{URL: "ssh://git@example.invalid/r.git", Ref: main,
			Auth: source.Auth{Identity: key.PrivateKey, KnownHosts: []byte("# nothing here\n")}}, []string{"known_hosts"}},
		{"credentials for a file url", source.Options{URL: "file:///tmp/r", Ref: main, AllowFileURLs: true,
			Auth: source.Auth{Username: "u", Password: "p"}}, []string{"file"}},
		{"relative file url", source.Options{URL: "file://r", Ref: source.Ref{Commit: commit}, AllowFileURLs: true}, []string{"file"}},
		{"file url without AllowFileURLs", source.Options{URL: "file:///tmp/r", Ref: main}, []string{"file://", "--allow-file-urls"}},
		{"path outside the repository", source.Options{URL: "https://example.invalid/r.git", Ref: main, Path: "../etc"}, []string{"path"}},
		{"short since", source.Options{URL: "https://example.invalid/r.git", Ref: main, Since: "abc"}, []string{"since"}},
		{"negative limit", source.Options{URL: "https://example.invalid/r.git", Ref: main, MaxFileBytes: -1}, []string{"negative"}},
		{"negative timeout", source.Options{URL: "https://example.invalid/r.git", Ref: main, Timeout: -time.Second}, []string{"timeout"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := source.Fetch(context.Background(), tc.o)
			assertKind(t, err, source.ErrInvalidOptions, tc.words...)
			if strings.Contains(tc.name, "credentials in the url") && strings.Contains(err.Error(), "secret@") {
				t.Fatalf("error leaks the password: %v", err)
			}
			_, err = source.RemoteRevision(context.Background(), tc.o)
			assertKind(t, err, source.ErrInvalidOptions)
		})
	}
}

func TestAuthFromSecret(t *testing.T) {
	a := source.AuthFromSecret(map[string][]byte{
		"username": []byte("u"), "password": []byte("p"), "bearerToken": []byte("t"),
		"identity": []byte("id"), "known_hosts": []byte("kh"), "ca.crt": []byte("ca"), "other": []byte("x"),
	})
	if a.Username != "u" || a.Password != "p" || a.BearerToken != "t" || string(a.Identity) != "id" ||
		string(a.KnownHosts) != "kh" || string(a.CABundle) != "ca" {
		t.Fatalf("%+v", a)
	}
}

func TestHTTPBasicAuth(t *testing.T) {
	h := newHistory(t)
	srv := sourcetest.ServeHTTP(t, filepath.Dir(h.repo.Dir), sourcetest.HTTPAuth{Username: "reader", Password: "s3cret"})
	url := srv.RepoURL(t, h.repo.Dir)
	good := source.Auth{Username: "reader", Password: "s3cret"}

	for _, ref := range []source.Ref{{Branch: "main"}, {Tag: "v1.1.0"}, {SemVer: "1.x"}, {Commit: h.c1, Branch: "main"}} {
		o := source.Options{URL: url, Ref: ref, Auth: good}
		a := fetch(t, o)
		rev, err := source.RemoteRevision(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		if rev != a.Revision {
			t.Fatalf("%+v: RemoteRevision %q != fetched %q", ref, rev, a.Revision)
		}
	}
	if srv.Fetches() < 4 {
		t.Fatalf("the server saw %d upload-pack requests, want at least 4", srv.Fetches())
	}

	_, err := source.Fetch(context.Background(), source.Options{URL: url, Ref: source.Ref{Branch: "main"},
		Auth: source.Auth{Username: "reader", Password: "wrong"}})
	assertKind(t, err, source.ErrAuthFailed, "check", "secret")
	if strings.Contains(err.Error(), "wrong") {
		t.Fatalf("error leaks the password: %v", err)
	}
	_, err = source.RemoteRevision(context.Background(), source.Options{URL: url, Ref: source.Ref{Branch: "main"}})
	assertKind(t, err, source.ErrAuthFailed)

	_, err = source.Fetch(context.Background(), source.Options{URL: srv.URL + "/absent", Ref: source.Ref{Branch: "main"}, Auth: good})
	assertKind(t, err, source.ErrRepositoryNotFound)
}

func TestHTTPBearerToken(t *testing.T) {
	h := newHistory(t)
	srv := sourcetest.ServeHTTP(t, filepath.Dir(h.repo.Dir), sourcetest.HTTPAuth{BearerToken: "tok-123"})
	url := srv.RepoURL(t, h.repo.Dir)
	a := fetch(t, source.Options{URL: url, Ref: source.Ref{Branch: "main"}, Auth: source.Auth{BearerToken: "tok-123"}})
	if a.Revision != "main@sha1:"+h.head || readFile(t, a, "m/v.txt") != "four" {
		t.Fatalf("revision %q", a.Revision)
	}
	_, err := source.Fetch(context.Background(), source.Options{URL: url, Ref: source.Ref{Branch: "main"}, Auth: source.Auth{BearerToken: "tok-999"}})
	assertKind(t, err, source.ErrAuthFailed)
	if strings.Contains(err.Error(), "tok-999") {
		t.Fatalf("error leaks the token: %v", err)
	}
	_, err = source.Fetch(context.Background(), source.Options{URL: url, Ref: source.Ref{Branch: "main"}, Auth: source.Auth{Username: "u", Password: "tok-123"}})
	assertKind(t, err, source.ErrAuthFailed)
}

func TestUnreachable(t *testing.T) {
	url := sourcetest.ClosedPortURL(t)
	start := time.Now()
	_, err := source.Fetch(context.Background(), source.Options{URL: url, Ref: source.Ref{Branch: "main"}, Timeout: 10 * time.Second})
	assertKind(t, err, source.ErrUnreachable, "127.0.0.1")
	_, err = source.RemoteRevision(context.Background(), source.Options{URL: url, Ref: source.Ref{Branch: "main"}, Timeout: 10 * time.Second})
	assertKind(t, err, source.ErrUnreachable)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("a refused connection took %s", d)
	}
}

func TestTimeout(t *testing.T) {
	srv := sourcetest.StallingServer(t)
	o := source.Options{URL: srv.URL + "/repo.git", Ref: source.Ref{Branch: "main"}, Timeout: 300 * time.Millisecond}
	for name, op := range map[string]func() error{
		"fetch": func() error { _, err := source.Fetch(context.Background(), o); return err },
		"list":  func() error { _, err := source.RemoteRevision(context.Background(), o); return err },
	} {
		start := time.Now()
		err := op()
		d := time.Since(start)
		assertKind(t, err, source.ErrTimeout, "timeout")
		if d < 300*time.Millisecond || d > 5*time.Second {
			t.Fatalf("%s returned after %s with a 300ms timeout", name, d)
		}
	}

	// The caller's cancellation is not a timeout.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err := source.Fetch(ctx, source.Options{URL: o.URL, Ref: o.Ref, Timeout: time.Minute})
	if err == nil || errors.Is(err, source.ErrTimeout) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled fetch: %v", err)
	}
}

func TestSSH(t *testing.T) {
	h := newHistory(t)
	client := sourcetest.NewSSHKey(t)
	srv := sourcetest.ServeSSH(t, filepath.Dir(h.repo.Dir), client.Public)
	url := srv.RepoURL(t, h.repo.Dir)
	auth := source.Auth{Identity: client.PrivateKey, KnownHosts: srv.KnownHosts}

	for _, ref := range []source.Ref{{Branch: "main"}, {Tag: "v2.0.0"}, {Commit: h.c2}} {
		o := source.Options{URL: url, Ref: ref, Auth: auth, Timeout: 20 * time.Second}
		a := fetch(t, o)
		rev, err := source.RemoteRevision(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		if rev != a.Revision {
			t.Fatalf("RemoteRevision %q != fetched %q", rev, a.Revision)
		}
	}

	// A known_hosts entry for this address with another key: the host key changed.
	other := sourcetest.ServeSSH(t, t.TempDir())
	wrongHosts := []byte(knownhosts.Line([]string{knownhosts.Normalize(srv.Addr)}, other.HostKey) + "\n")
	_, err := source.Fetch(context.Background(), source.Options{URL: url, Ref: source.Ref{Branch: "main"},
		Auth: source.Auth{Identity: client.PrivateKey, KnownHosts: wrongHosts}})
	assertKind(t, err, source.ErrHostKey, "known_hosts")

	// known_hosts that only knows another host: unknown host.
	_, err = source.RemoteRevision(context.Background(), source.Options{URL: url, Ref: source.Ref{Branch: "main"},
		Auth: source.Auth{Identity: client.PrivateKey, KnownHosts: other.KnownHosts}})
	assertKind(t, err, source.ErrHostKey, "known_hosts")

	// A key the server does not know.
	stranger := sourcetest.NewSSHKey(t)
	_, err = source.Fetch(context.Background(), source.Options{URL: url, Ref: source.Ref{Branch: "main"},
		Auth: source.Auth{Identity: stranger.PrivateKey, KnownHosts: srv.KnownHosts}})
	assertKind(t, err, source.ErrAuthFailed, "identity")
}
