// Package source fetches a git repository at a ref into a temporary worktree and verifies
// the signatures of its HEAD commit and tag. It is what the ManifestRegistry reconciler
// calls; it has no Kubernetes dependency (Secret data comes in as map[string][]byte).
//
// Fetching goes through go-git (https, http, ssh with known_hosts, file); refs are a branch,
// a tag, a semver range over tags (the highest matching tag wins, Masterminds/semver) or a
// full commit SHA. Revisions use Flux's form: `main@sha1:<hex>`, `v1.2.0@sha1:<hex>`,
// `sha1:<hex>`. Signatures: SSH (hiddeco/sshsig, namespace "git") and OpenPGP (go-git's
// Commit.Verify / Tag.Verify). Every error is an *Error matching one sentinel (errors.Is).
package source

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/Masterminds/semver/v3"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	gitssh "github.com/go-git/go-git/v5/plumbing/transport/ssh"
	"github.com/go-git/go-git/v5/storage/memory"
	"github.com/skeema/knownhosts"
	"golang.org/x/crypto/ssh"
)

// DefaultTimeout bounds Fetch and RemoteRevision when Options.Timeout is zero.
const DefaultTimeout = 60 * time.Second

// Ref selects what to fetch. Exactly one of Branch, Tag, SemVer and Commit is set, except
// that Commit may come with Branch (the branch to fetch the commit from; it also names the
// revision).
type Ref struct {
	Branch string
	Tag    string
	// SemVer is a Masterminds/semver constraint such as ">=1.2.0 <2.0.0" or "~1.4"; the
	// highest tag that parses as a version and satisfies it is fetched. Pre-release tags
	// only match constraints that name a pre-release. Between tags of equal precedence
	// (v1.0.0 and 1.0.0, or differing build metadata) the lexically greatest name wins.
	SemVer string
	// Commit is a full 40-hex SHA-1.
	Commit string
}

// Auth holds the credentials of a remote. Which fields may be set depends on the URL
// scheme: http(s) takes Username+Password or BearerToken (and CABundle); ssh needs Identity
// and KnownHosts (Username is the ssh user when the URL has none, default "git"; Password
// is the passphrase of an encrypted Identity); file takes none.
type Auth struct {
	Username    string
	Password    string
	BearerToken string
	// Identity is a PEM (or OpenSSH) private key.
	Identity []byte
	// KnownHosts is in OpenSSH known_hosts format (ssh-keyscan output). Required for ssh:
	// without it Fetch refuses to connect rather than trust any host.
	KnownHosts []byte
	// CABundle is PEM certificates trusted for https besides the system pool.
	CABundle []byte
}

// AuthFromSecret reads Auth from a Secret's data, with Flux's key names: `username`,
// `password`, `bearerToken`, `identity`, `known_hosts`, `ca.crt`. Other keys are ignored.
func AuthFromSecret(data map[string][]byte) Auth {
	return Auth{
		Username:    string(data["username"]),
		Password:    string(data["password"]),
		BearerToken: string(data["bearerToken"]),
		Identity:    data["identity"],
		KnownHosts:  data["known_hosts"],
		CABundle:    data["ca.crt"],
	}
}

// Options describe one fetch.
type Options struct {
	// URL is https://, http://, ssh://[user@]host[:port]/path or file:///abs/path.
	// Credentials belong in Auth, not in the URL.
	URL string
	Ref Ref
	// Auth is ignored for file URLs (it must be empty).
	Auth Auth
	// Timeout bounds the whole operation (listing, cloning, checkout); zero means
	// DefaultTimeout. The context's own deadline, if earlier, applies too.
	Timeout time.Duration
	// TempDir is where the worktree directory (and, for a moment, a copy of known_hosts) is
	// created; empty means os.TempDir().
	TempDir string
	// ObjectsOnly clones the git objects without checking files out: read them with
	// Artifact.FS. Much faster for many small files (no file per blob on disk).
	ObjectsOnly bool
}

// Artifact is a fetched revision checked out in Dir. Call Cleanup when done with it.
type Artifact struct {
	// Dir is the worktree (with its .git directory); it belongs to the caller.
	Dir string
	// Revision is `<branch or tag>@sha1:<commit>`, or `sha1:<commit>` for a bare commit ref.
	Revision string
	// Commit is the 40-hex SHA-1 of the checked-out commit.
	Commit string
	// Tag is the tag name for Tag and SemVer refs, empty otherwise.
	Tag string
	// URL is the remote, without credentials.
	URL string

	repo *git.Repository
}

// Cleanup removes Dir. It is safe to call more than once and on a nil Artifact.
func (a *Artifact) Cleanup() error {
	if a == nil || a.Dir == "" {
		return nil
	}
	err := os.RemoveAll(a.Dir)
	a.Dir, a.repo = "", nil
	return err
}

// prepared is Options after validation: the parsed URL and the go-git auth method.
type prepared struct {
	objectsOnly bool
	url         string // as given, for go-git
	display     string // redacted, for messages
	auth        transport.AuthMethod
	ca          []byte
	ref         Ref
	semver      *semver.Constraints
	timeout     time.Duration
}

// prepare validates o. Errors are ErrInvalidOptions and say which field to fix.
func prepare(o Options) (*prepared, error) {
	p := &prepared{url: o.URL, ref: o.Ref, timeout: o.Timeout, objectsOnly: o.ObjectsOnly}
	if p.timeout < 0 {
		return nil, optionsError("timeout %s is negative", o.Timeout)
	}
	if p.timeout == 0 {
		p.timeout = DefaultTimeout
	}
	if o.URL == "" {
		return nil, optionsError("url is empty")
	}
	u, err := url.Parse(o.URL)
	if err != nil || u.Scheme == "" {
		return nil, optionsError("url %q is not a URL; use https://, ssh://user@host/path or file:///path", o.URL)
	}
	p.display = u.Redacted()
	if err := prepareRef(p); err != nil {
		return nil, err
	}
	a := o.Auth
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" {
			return nil, optionsError("url %s has no host", p.display)
		}
		if u.User != nil {
			return nil, optionsError("url %s carries credentials; put them in the secret (username/password or bearerToken)", p.display)
		}
		if len(a.Identity) > 0 || len(a.KnownHosts) > 0 {
			return nil, optionsError("identity/known_hosts are for ssh URLs, and %s is %s", p.display, u.Scheme)
		}
		switch {
		case a.BearerToken != "" && (a.Username != "" || a.Password != ""):
			return nil, optionsError("set either bearerToken or username/password, not both")
		case a.BearerToken != "":
			p.auth = &githttp.TokenAuth{Token: a.BearerToken}
		case a.Username != "" && a.Password != "":
			p.auth = &githttp.BasicAuth{Username: a.Username, Password: a.Password}
		case a.Username != "" || a.Password != "":
			return nil, optionsError("basic auth needs both username and password (for token-based hosts any username works)")
		}
		p.ca = a.CABundle
	case "ssh":
		if u.Host == "" {
			return nil, optionsError("url %s has no host", p.display)
		}
		if _, hasPassword := u.User.Password(); hasPassword {
			return nil, optionsError("url %s carries a password; ssh authenticates with identity from the secret", p.display)
		}
		if a.BearerToken != "" || len(a.CABundle) > 0 {
			return nil, optionsError("bearerToken/ca.crt are for https URLs, and %s is ssh", p.display)
		}
		if len(a.KnownHosts) == 0 {
			return nil, optionsError("ssh needs known_hosts in the secret (for example from ssh-keyscan -p PORT HOST); refusing to trust any host key")
		}
		if len(a.Identity) == 0 {
			return nil, optionsError("ssh needs identity (a private key) in the secret")
		}
		user := u.User.Username()
		if user == "" {
			user = a.Username
		}
		if user == "" {
			user = "git"
		}
		keys, err := gitssh.NewPublicKeys(user, a.Identity, a.Password)
		if err != nil {
			var missing *ssh.PassphraseMissingError
			if errors.As(err, &missing) {
				return nil, optionsError("identity is encrypted; put its passphrase in password")
			}
			// The parse error never contains key material.
			return nil, optionsError("identity is not a usable private key: %v", err)
		}
		port := u.Port()
		if port == "" {
			port = "22"
		}
		db, err := knownHostsDB(a.KnownHosts, o.TempDir)
		if err != nil {
			return nil, optionsError("known_hosts: %v", err)
		}
		keys.HostKeyCallback = db.HostKeyCallback()
		keys.HostKeyAlgorithms = db.HostKeyAlgorithms(net.JoinHostPort(u.Hostname(), port))
		p.auth = keys
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, optionsError("file url %s names a host; use file:///absolute/path", p.display)
		}
		if !strings.HasPrefix(u.Path, "/") {
			return nil, optionsError("file url %s needs an absolute path", p.display)
		}
		if a.Username != "" || a.Password != "" || a.BearerToken != "" ||
			len(a.Identity) > 0 || len(a.KnownHosts) > 0 || len(a.CABundle) > 0 {
			return nil, optionsError("file URLs take no credentials; remove the secretRef")
		}
	default:
		return nil, optionsError("url scheme %q is not supported; use https, http, ssh or file (for scp-like addresses write ssh://user@host/path)", u.Scheme)
	}
	return p, nil
}

func prepareRef(p *prepared) error {
	r := &p.ref
	set := 0
	for _, s := range []string{r.Branch, r.Tag, r.SemVer, r.Commit} {
		if s != "" {
			set++
		}
	}
	if r.Commit != "" && r.Branch != "" {
		set-- // commit on a branch counts once
	}
	if set != 1 {
		return optionsError("ref must set exactly one of branch, tag, semver or commit (commit may come with branch); got %+v", *r)
	}
	if r.Branch != "" {
		if err := plumbing.NewBranchReferenceName(r.Branch).Validate(); err != nil {
			return optionsError("branch %q is not a valid branch name", r.Branch)
		}
	}
	if r.Tag != "" {
		if err := plumbing.NewTagReferenceName(r.Tag).Validate(); err != nil {
			return optionsError("tag %q is not a valid tag name", r.Tag)
		}
	}
	if r.SemVer != "" {
		c, err := semver.NewConstraint(r.SemVer)
		if err != nil {
			return optionsError("semver %q is not a version range: %v", r.SemVer, err)
		}
		p.semver = c
	}
	if r.Commit != "" {
		r.Commit = strings.ToLower(r.Commit)
		if _, err := hex.DecodeString(r.Commit); err != nil || len(r.Commit) != 40 {
			return optionsError("commit %q is not a full 40-character SHA-1", r.Commit)
		}
	}
	return nil
}

// knownHostsDB parses known_hosts bytes with skeema/knownhosts (which also tells go-git
// which host key algorithms to ask for). The library reads files, so the bytes go through
// a private temporary file that is removed at once.
func knownHostsDB(data []byte, tempDir string) (*knownhosts.HostKeyDB, error) {
	entries := 0
	for rest := data; ; entries++ {
		var err error
		_, _, _, _, rest, err = ssh.ParseKnownHosts(rest)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if entries == 0 {
		return nil, errors.New("no host keys found")
	}
	f, err := os.CreateTemp(tempDir, "reversi-known-hosts-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	return knownhosts.NewDB(f.Name())
}

// withTimeout runs op with the timeout applied and returns as soon as the deadline passes,
// even when go-git does not notice it (an SSH handshake is not bound to the context). A
// late result is handed to late, which must release it (remove a directory).
func withTimeout[T any](ctx context.Context, timeout time.Duration, op func(context.Context) (T, error), late func(T)) (T, context.Context, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := op(ctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		cancel()
		return r.v, ctx, r.err
	case <-ctx.Done():
		go func() {
			r := <-done
			cancel()
			if r.err == nil && late != nil {
				late(r.v)
			}
		}()
		var zero T
		return zero, ctx, ctx.Err()
	}
}

// listRefs lists the remote's references (with peeled tags as "refs/tags/x^{}").
func listRefs(ctx context.Context, p *prepared) ([]*plumbing.Reference, error) {
	remote := git.NewRemote(memory.NewStorage(), &config.RemoteConfig{Name: "origin", URLs: []string{p.url}})
	return remote.ListContext(ctx, &git.ListOptions{Auth: p.auth, CABundle: p.ca, PeelingOption: git.AppendPeeled})
}

// resolved is a ref resolved against the remote's advertisement.
type resolved struct {
	name string // revision prefix: branch or tag name; empty for a bare commit
	tag  string
	hash string // commit hash (peeled), empty when unknown
}

func (r resolved) revision() string {
	if r.name == "" {
		return "sha1:" + r.hash
	}
	return r.name + "@sha1:" + r.hash
}

// resolve finds p.ref in refs. It fails with ErrRefNotFound when the ref is absent.
func resolve(p *prepared, refs []*plumbing.Reference) (resolved, error) {
	byName := make(map[string]string, len(refs))
	for _, r := range refs {
		if r.Type() == plumbing.HashReference {
			byName[r.Name().String()] = r.Hash().String()
		}
	}
	notFound := func(format string, args ...any) error {
		return &Error{Op: "resolve", Subject: p.display, Kind: ErrRefNotFound, Err: fmt.Errorf(format, args...),
			Hint: "check the ref in the spec, or push it"}
	}
	tagHash := func(tag string) string {
		name := plumbing.NewTagReferenceName(tag).String()
		if h, ok := byName[name+"^{}"]; ok {
			return h
		}
		return byName[name]
	}
	ref := p.ref
	switch {
	case ref.Commit != "":
		if ref.Branch != "" {
			if _, ok := byName[plumbing.NewBranchReferenceName(ref.Branch).String()]; !ok {
				return resolved{}, notFound("branch %q not found", ref.Branch)
			}
		}
		return resolved{name: ref.Branch, hash: ref.Commit}, nil
	case ref.Branch != "":
		h, ok := byName[plumbing.NewBranchReferenceName(ref.Branch).String()]
		if !ok {
			return resolved{}, notFound("branch %q not found", ref.Branch)
		}
		return resolved{name: ref.Branch, hash: h}, nil
	case ref.Tag != "":
		h := tagHash(ref.Tag)
		if h == "" {
			return resolved{}, notFound("tag %q not found", ref.Tag)
		}
		return resolved{name: ref.Tag, tag: ref.Tag, hash: h}, nil
	default:
		var tags []string
		for name := range byName {
			if t, ok := strings.CutPrefix(name, "refs/tags/"); ok && !strings.HasSuffix(t, "^{}") {
				tags = append(tags, t)
			}
		}
		best := highestMatching(p.semver, tags)
		if best == "" {
			return resolved{}, notFound("no tag matches semver %q (%d tags on the remote)", ref.SemVer, len(tags))
		}
		return resolved{name: best, tag: best, hash: tagHash(best)}, nil
	}
}

// highestMatching returns the tag with the highest version satisfying c, or "" if none.
// Tags that do not parse as versions are skipped.
func highestMatching(c *semver.Constraints, tags []string) string {
	type cand struct {
		v   *semver.Version
		tag string
	}
	var cands []cand
	for _, t := range tags {
		v, err := semver.NewVersion(t)
		if err != nil || !c.Check(v) {
			continue
		}
		cands = append(cands, cand{v, t})
	}
	if len(cands) == 0 {
		return ""
	}
	sort.Slice(cands, func(i, j int) bool {
		if c := cands[i].v.Compare(cands[j].v); c != 0 {
			return c < 0
		}
		return cands[i].tag < cands[j].tag
	})
	return cands[len(cands)-1].tag
}

// RemoteRevision returns the revision Fetch would produce now, by listing the remote's refs
// (no clone): `main@sha1:<hex>`, `v1.2.0@sha1:<hex>` (the commit an annotated tag points to,
// as the server advertises it peeled), or `sha1:<commit>` / `<branch>@sha1:<commit>` for a
// commit ref (the commit itself is not checked; only that the branch exists). The reconciler
// compares it with the last fetched revision to skip a clone.
//
// Errors are *Error: ErrInvalidOptions, ErrAuthFailed, ErrHostKey, ErrRepositoryNotFound,
// ErrUnreachable, ErrTimeout, ErrRefNotFound or ErrFetchFailed.
func RemoteRevision(ctx context.Context, o Options) (string, error) {
	p, err := prepare(o)
	if err != nil {
		return "", err
	}
	refs, opCtx, err := withTimeout(ctx, p.timeout, func(ctx context.Context) ([]*plumbing.Reference, error) {
		return listRefs(ctx, p)
	}, nil)
	if err != nil {
		return "", classify("list", p, err, opCtx, ctx)
	}
	r, err := resolve(p, refs)
	if err != nil {
		return "", err
	}
	return r.revision(), nil
}

// Fetch clones o.URL at o.Ref into a new directory under o.TempDir and checks out the
// commit. Branch and tag refs are cloned shallow (depth 1, that ref only); a semver ref
// lists the remote's tags first, picks the highest match and clones that tag shallow; a
// commit ref clones the branch (or every branch and tag) in full and checks the commit out.
// The whole operation is bounded by o.Timeout and ctx.
//
// On success the caller owns the Artifact and must call Cleanup. On failure nothing is
// left on disk and the error is an *Error matching one of ErrInvalidOptions, ErrAuthFailed,
// ErrHostKey, ErrRepositoryNotFound, ErrUnreachable, ErrTimeout, ErrRefNotFound or
// ErrFetchFailed. Fetch does not verify signatures: call Verify on the Artifact.
func Fetch(ctx context.Context, o Options) (*Artifact, error) {
	p, err := prepare(o)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(o.TempDir, "reversi-source-")
	if err != nil {
		return nil, &Error{Op: "fetch", Subject: p.display, Kind: ErrFetchFailed, Err: err, Hint: "cannot create the temporary directory"}
	}
	a, opCtx, err := withTimeout(ctx, p.timeout, func(ctx context.Context) (*Artifact, error) {
		return fetch(ctx, p, dir)
	}, func(a *Artifact) { _ = a.Cleanup() })
	if err != nil {
		// fetch removes dir when it fails; when it is still running past the deadline, the
		// late callback removes the directory of a clone that succeeds after all.
		return nil, classify("fetch", p, err, opCtx, ctx)
	}
	return a, nil
}

func fetch(ctx context.Context, p *prepared, dir string) (*Artifact, error) {
	ref := p.ref
	if ref.SemVer != "" {
		refs, err := listRefs(ctx, p)
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		r, err := resolve(p, refs)
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		ref = Ref{Tag: r.tag}
	}
	co := &git.CloneOptions{
		URL:        p.url,
		Auth:       p.auth,
		CABundle:   p.ca,
		RemoteName: "origin",
		Tags:       git.NoTags,
	}
	name := ""
	switch {
	case ref.Commit != "":
		co.NoCheckout = true
		if ref.Branch != "" {
			co.ReferenceName = plumbing.NewBranchReferenceName(ref.Branch)
			co.SingleBranch = true
			name = ref.Branch
		} else {
			co.Tags = git.AllTags
		}
	case ref.Branch != "":
		co.ReferenceName = plumbing.NewBranchReferenceName(ref.Branch)
		co.SingleBranch, co.Depth = true, 1
		name = ref.Branch
	case ref.Tag != "":
		co.ReferenceName = plumbing.NewTagReferenceName(ref.Tag)
		co.SingleBranch, co.Depth = true, 1
		name = ref.Tag
	}
	if p.objectsOnly {
		co.NoCheckout = true
	}
	fail := func(err error) (*Artifact, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	repo, err := git.PlainCloneContext(ctx, dir, false, co)
	if err != nil {
		if errors.Is(err, git.NoMatchingRefSpecError{}) || errors.Is(err, plumbing.ErrReferenceNotFound) {
			return fail(&Error{Op: "fetch", Subject: p.display, Kind: ErrRefNotFound, Err: err,
				Hint: "check the ref in the spec, or push it"})
		}
		return fail(err)
	}
	var commit plumbing.Hash
	if ref.Commit != "" {
		commit = plumbing.NewHash(ref.Commit)
		if _, err := repo.CommitObject(commit); err != nil {
			where := "any branch or tag"
			if ref.Branch != "" {
				where = "branch " + ref.Branch
			}
			return fail(&Error{Op: "fetch", Subject: p.display, Kind: ErrRefNotFound,
				Err: fmt.Errorf("commit %s not found on %s: %w", ref.Commit, where, err), Hint: "check the commit in the spec"})
		}
		if !p.objectsOnly {
			wt, err := repo.Worktree()
			if err != nil {
				return fail(err)
			}
			if err := wt.Checkout(&git.CheckoutOptions{Hash: commit, Force: true}); err != nil {
				return fail(fmt.Errorf("checkout %s: %w", ref.Commit, err))
			}
		}
	} else {
		head, err := repo.Head()
		if err != nil {
			return fail(fmt.Errorf("resolve HEAD: %w", err))
		}
		c, err := repo.CommitObject(head.Hash())
		if err != nil {
			return fail(fmt.Errorf("%s does not point to a commit: %w", name, err))
		}
		commit = c.Hash
	}
	r := resolved{name: name, tag: ref.Tag, hash: commit.String()}
	return &Artifact{Dir: dir, Revision: r.revision(), Commit: r.hash, Tag: ref.Tag, URL: p.display, repo: repo}, nil
}
