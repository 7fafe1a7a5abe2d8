// Package sourcetest makes real git repositories and git servers for tests: repositories
// built with the git CLI, commits and tags signed with ssh-keygen made ed25519 keys
// (gpg.format=ssh) or with a throwaway GnuPG key, a smart-HTTP server (`git http-backend`
// behind net/http/cgi on 127.0.0.1, with optional basic or bearer auth) and an SSH server
// (golang.org/x/crypto/ssh on 127.0.0.1 running `git upload-pack`). It is used by the tests
// of pkg/source and by the controllers' envtest tests.
//
// Everything fails the test (t.Fatal) on error; tools that are missing fail it too, with the
// package to install, except gpg, whose absence skips the test (NewGPGKey).
package sourcetest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// RequireTools fails the test when one of the commands is not on PATH.
func RequireTools(t testing.TB, tools ...string) {
	t.Helper()
	pkg := map[string]string{"git": "git", "ssh-keygen": "openssh-client", "gpg": "gnupg"}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed by this test: install it (apt-get install %s)", tool, pkg[tool])
		}
	}
}

// gitEnv isolates git from the user's and the system's configuration and fixes identities.
func gitEnv(home string, extra ...string) []string {
	env := append(os.Environ(),
		"HOME="+home,
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL="+os.DevNull,
		"GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=Reversi Test",
		"GIT_AUTHOR_EMAIL=test@reversi.invalid",
		"GIT_COMMITTER_NAME=Reversi Test",
		"GIT_COMMITTER_EMAIL=test@reversi.invalid",
		"LC_ALL=C",
	)
	return append(env, extra...)
}

// Repo is a non-bare git repository on the default branch "main".
type Repo struct {
	// Dir is the repository's worktree (the .git directory is inside).
	Dir  string
	t    testing.TB
	home string
}

// NewRepo makes an empty repository in a new temporary directory (a directory named "repo"
// in t.TempDir(), so that its parent can be served as a root holding only this repository).
// Its git-upload-pack (file://, ssh and http-backend alike) supports partial clone
// (uploadpack.allowFilter true), as hosted git servers do; see DisallowFilter.
func NewRepo(t testing.TB) *Repo {
	t.Helper()
	RequireTools(t, "git")
	base := t.TempDir()
	r := &Repo{Dir: filepath.Join(base, "repo"), t: t, home: t.TempDir()}
	r.run(nil, nil, "init", "-q", "-b", "main", r.Dir)
	r.run(nil, nil, "config", "uploadpack.allowFilter", "true")
	return r
}

// DisallowFilter makes the repository's upload-pack refuse partial clone: it no longer
// advertises the filter capability (git's default for a plain server).
func (r *Repo) DisallowFilter() {
	r.t.Helper()
	r.run(nil, nil, "config", "uploadpack.allowFilter", "false")
}

// run runs git in r.Dir and returns its stdout exactly.
func (r *Repo) run(env []string, stdin []byte, args ...string) string {
	r.t.Helper()
	cmd := exec.Command("git", args...)
	if _, err := os.Stat(r.Dir); err == nil {
		cmd.Dir = r.Dir
	}
	cmd.Env = gitEnv(r.home, env...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		r.t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// Git runs git with args in the repository and returns its trimmed stdout.
func (r *Repo) Git(args ...string) string {
	r.t.Helper()
	return strings.TrimSpace(r.run(nil, nil, args...))
}

// WriteFile writes content to path (relative to the worktree), making directories.
func (r *Repo) WriteFile(path, content string) {
	r.t.Helper()
	full := filepath.Join(r.Dir, filepath.FromSlash(path))
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// WriteZeros writes a file of size zero bytes at path (relative to the worktree) as a
// sparse file: it costs no disk space, and git stores it compressed to about a thousandth
// of its size.
func (r *Repo) WriteZeros(path string, size int64) {
	r.t.Helper()
	full := filepath.Join(r.Dir, filepath.FromSlash(path))
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		r.t.Fatal(err)
	}
	f, err := os.Create(full)
	if err != nil {
		r.t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		r.t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		r.t.Fatal(err)
	}
}

// Commit stages everything and commits it unsigned; it returns the commit hash.
func (r *Repo) Commit(message string) string {
	r.t.Helper()
	r.run(nil, nil, "add", "-A")
	r.run(nil, nil, "-c", "commit.gpgsign=false", "commit", "-q", "--allow-empty", "-m", message)
	return r.Rev("HEAD")
}

// CommitSigned stages everything and commits it signed by s; it returns the commit hash.
func (r *Repo) CommitSigned(message string, s Signer) string {
	r.t.Helper()
	r.run(nil, nil, "add", "-A")
	args := append(s.GitArgs(), "commit", "-q", "--allow-empty", "-S", "-m", message)
	r.run(s.Env(), nil, args...)
	return r.Rev("HEAD")
}

// Branch creates (or moves) branch name to HEAD without switching to it.
func (r *Repo) Branch(name string) {
	r.t.Helper()
	r.run(nil, nil, "branch", "-f", name)
}

// Checkout switches to branch, creating it at HEAD when it does not exist.
func (r *Repo) Checkout(branch string) {
	r.t.Helper()
	probe := exec.Command("git", "rev-parse", "--verify", "-q", "refs/heads/"+branch)
	probe.Dir, probe.Env = r.Dir, gitEnv(r.home)
	if err := probe.Run(); err != nil {
		r.run(nil, nil, "checkout", "-q", "-b", branch)
		return
	}
	r.run(nil, nil, "checkout", "-q", branch)
}

// Tag creates the lightweight tag name at HEAD. A lightweight tag is only a ref, so when
// HEAD is a loose branch ref (as after Commit) Tag writes the tag's loose ref itself, as
// git does, without starting git: tests make thousands of them.
func (r *Repo) Tag(name string) {
	r.t.Helper()
	gitDir := filepath.Join(r.Dir, ".git")
	head, err := os.ReadFile(filepath.Join(gitDir, "HEAD"))
	branch, ok := strings.CutPrefix(strings.TrimSpace(string(head)), "ref: refs/heads/")
	ref := filepath.Join(gitDir, "refs", "tags", filepath.FromSlash(name))
	if err != nil || !ok || strings.ContainsAny(name, "^~:?*[\\ ") || strings.Contains(name, "..") {
		r.run(nil, nil, "tag", name)
		return
	}
	hash, err := os.ReadFile(filepath.Join(gitDir, "refs", "heads", filepath.FromSlash(branch)))
	if h := strings.TrimSpace(string(hash)); err != nil || len(h) != 40 {
		r.run(nil, nil, "tag", name) // a packed or unborn branch
		return
	}
	if _, err := os.Lstat(ref); err == nil {
		r.t.Fatalf("git tag %s: the tag already exists", name)
	}
	if err := os.MkdirAll(filepath.Dir(ref), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(ref, hash, 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// TagAnnotated creates the unsigned annotated tag name at HEAD.
func (r *Repo) TagAnnotated(name, message string) {
	r.t.Helper()
	r.run(nil, nil, "-c", "tag.gpgsign=false", "tag", "-a", "-m", message, name)
}

// TagAnnotatedMany creates an unsigned annotated tag at HEAD for each of names, all with
// message, in one `git fast-import` (thousands of tags in well under a second).
func (r *Repo) TagAnnotatedMany(names []string, message string) {
	r.t.Helper()
	head := r.Rev("HEAD")
	var b strings.Builder
	for _, name := range names {
		fmt.Fprintf(&b, "tag %s\nfrom %s\ntagger Reversi Test <test@reversi.invalid> 1700000000 +0000\ndata %d\n%s\n",
			name, head, len(message), message)
	}
	r.run(nil, []byte(b.String()), "fast-import", "--quiet")
}

// TagSigned creates the annotated tag name at HEAD, signed by s.
func (r *Repo) TagSigned(name, message string, s Signer) {
	r.t.Helper()
	args := append(s.GitArgs(), "tag", "-s", "-m", message, name)
	r.run(s.Env(), nil, args...)
}

// Rev resolves a revision (branch, tag, HEAD...) to the commit hash it points to.
func (r *Repo) Rev(rev string) string {
	r.t.Helper()
	return r.Git("rev-parse", rev+"^{commit}")
}

// TamperCommit rewrites the commit at the tip of branch with "TAMPERED " put in front of
// its message, keeping every header including the signature, stores it and moves the
// branch to it. It returns the new commit's hash: a commit whose signature no longer
// matches its content.
func (r *Repo) TamperCommit(branch string) string {
	r.t.Helper()
	return r.tamper("commit", r.Rev("refs/heads/"+branch), "refs/heads/"+branch)
}

// TamperTag does to the annotated tag name what TamperCommit does to a commit (the
// signature trails the message in a tag object) and returns the new tag object's hash.
func (r *Repo) TamperTag(name string) string {
	r.t.Helper()
	return r.tamper("tag", r.Git("rev-parse", "refs/tags/"+name), "refs/tags/"+name)
}

func (r *Repo) tamper(kind, hash, ref string) string {
	r.t.Helper()
	raw := r.run(nil, nil, "cat-file", kind, hash)
	i := strings.Index(raw, "\n\n")
	if i < 0 {
		r.t.Fatalf("%s %s has no message", kind, hash)
	}
	forged := raw[:i+2] + "TAMPERED " + raw[i+2:]
	h := strings.TrimSpace(r.run(nil, []byte(forged), "hash-object", "-t", kind, "-w", "--stdin"))
	r.run(nil, nil, "update-ref", ref, h)
	return h
}

// FileURL is the repository's file:// URL.
func (r *Repo) FileURL() string {
	return "file://" + filepath.ToSlash(r.Dir)
}
