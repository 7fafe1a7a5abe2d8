// Package source fetches one revision of a git repository into a temporary directory,
// bounded in memory and disk, and verifies the signatures of its commits and tags. It is
// what the ManifestRegistry reconciler calls; it has no Kubernetes dependency (Secret data
// comes in as map[string][]byte).
//
// Refs are a branch, a tag, a semver range over tags (the highest matching tag wins,
// Masterminds/semver; with tag verification the highest whose signature verifies) or a full
// commit SHA. Revisions use Flux's form: `main@sha1:<hex>`, `v1.2.0@sha1:<hex>`,
// `sha1:<hex>`. Signatures: SSH (hiddeco/sshsig, namespace "git") and OpenPGP (go-git's
// Commit.Verify / Tag.Verify). Every error is an *Error matching one sentinel (errors.Is).
//
// # Bounded, partial fetch
//
// Fetch speaks git's upload-pack protocol through go-git's transports (https, http, ssh
// with known_hosts, file) and never checks files out:
//
//   - The ref advertisement, read on every RemoteRevision and Fetch before anything else, is
//     bounded as go-git reads it: at most MaxRefs pkt-lines (refs; a peeled tag line counts
//     as one) and 256 bytes per ref of MaxRefs plus 64 KiB; past either the read fails with
//     ErrTooLarge, so go-git never holds more than an advertisement of MaxRefs refs. The
//     answer to each fetch request is bounded likewise by the pack limit below plus that
//     size (for the shallow and acknowledgement lines go-git decodes before the pack). For
//     http(s) the bound is the RoundTripper of go-git's HTTP client (githttp.NewClient with
//     a client of our own, nothing installed globally): it sees the body after net/http has
//     inflated a gzip encoding, and reads at most 4 KiB of an error answer (not 2xx). go-git's
//     file and ssh transports take no reader, client or dialer of ours; their session keeps
//     git-upload-pack's standard output in an exported field, Stdout, which Fetch replaces
//     (by reflection) with the bounded reader before anything is read, failing closed if a
//     go-git upgrade removes it. What stays unbounded is only bounded otherwise: the shallow
//     lines of an answer by its bytes (20 to 40 bytes of memory for each 52-byte line), and
//     a server's stderr, which go-git reads a line of (at most 64 KiB) and discards.
//   - The content of the one commit is fetched shallow (depth 1) with the partial-clone filter
//     `blob:limit=<MaxFileBytes+1>` when the server advertises the `filter` capability: blobs
//     over the limit are not sent at all.
//   - When Options.Since names the commit applied last, the commit history of the head is
//     fetched too, without trees or blobs (`filter tree:0`), first 64 commits deep, then
//     MaxCommits deep if that did not reach Since: enough for Artifact.Descends and for
//     Verify's mode Chain. A commit ref is found the same way, in the history of its branch
//     (or of every branch and tag), and its content fetched from the nearest tip.
//   - A semver ref with verified tags (Options.Verify) first fetches the tag objects of the
//     candidates, highest first, with their commits (depth 1, `filter tree:0`), in batches
//     of 16, 64, 256, 1024 and the rest, one request each, until one verifies: at most
//     MaxTagCandidates annotated tags in at most MaxTagRequests requests. Lightweight tags
//     are skipped without a fetch.
//   - Every pack the server sends is written to a file in the temporary directory (its
//     compressed size bounded by MaxTotalBytes + MaxTotalBytes/16 + 8 MiB) and scanned
//     object header by object header with go-git's packfile.Scanner before go-git indexes it:
//     each object's inflated size (the header's length; for a delta, the target size from the
//     delta's own header) must be at most MaxFileBytes, their sum at most MaxTotalBytes and
//     their count at most MaxObjects. So a server that ignores the filter cannot make the
//     process inflate a large object: go-git's indexer inflates every object whole.
//   - Artifact.FS reads only the files under Options.Path, checking each blob's size (from
//     its object header) against MaxFileBytes and the running total against MaxTotalBytes
//     before reading it. A blob under Path that the filter left out is ErrTooLarge. Every
//     entry under Path (file, folder, link) counts against MaxFiles and costs 256 bytes plus
//     its path against MaxTotalBytes, so empty files, folders or one tree referenced many
//     times cannot grow the FS past the limits; tree objects are bounded in the pack like
//     every object (one at most MaxFileBytes, all at most MaxTotalBytes).
//
// Without the `filter` capability (git's uploadpack.allowFilter is false, the default of a
// bare git server) the same fetches are made unfiltered and the same limits apply: a
// repository whose commit holds a file over MaxFileBytes anywhere, or whose history within
// the fetched depth holds more than MaxTotalBytes, fails with ErrTooLarge and a message
// that names uploadpack.allowFilter. Nothing is ever inflated past the limits.
package source

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/Masterminds/semver/v3"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	gitssh "github.com/go-git/go-git/v5/plumbing/transport/ssh"
	"github.com/go-git/go-git/v5/storage/filesystem"
	"github.com/skeema/knownhosts"
	"golang.org/x/crypto/ssh"
)

// DefaultTimeout bounds Fetch and RemoteRevision when Options.Timeout is zero.
const DefaultTimeout = 60 * time.Second

// Default limits of Options (used when the field is zero).
const (
	// DefaultMaxFileBytes bounds one file (one git object): 4 MiB.
	DefaultMaxFileBytes int64 = 4 << 20
	// DefaultMaxTotalBytes bounds the files under Path, and the inflated objects of one
	// pack: 64 MiB.
	DefaultMaxTotalBytes int64 = 64 << 20
	// DefaultMaxObjects bounds the objects of one pack.
	DefaultMaxObjects = 100_000
	// DefaultMaxFiles bounds the files and folders under Path: ten times the ~10,000 files
	// of a registry of 5,000 tools.
	DefaultMaxFiles = 100_000
	// DefaultMaxRefs bounds the refs a remote advertises (each peeled tag line counts).
	DefaultMaxRefs = 50_000
	// DefaultMaxCommits bounds the depth of the history fetched for Since and commit refs.
	DefaultMaxCommits = 10_000
	// MaxTagCandidates bounds the annotated tags in a semver range that are tried, highest
	// first, when tags are verified (Options.Verify): their tag objects fetched and their
	// signatures checked. Lightweight tags carry no signature and are skipped without a
	// fetch, so they count against MaxRefs only. When none of the MaxTagCandidates highest
	// annotated tags verifies and there are more, Fetch fails with ErrTooLarge naming the
	// limit. Large enough that a pusher without keys needs thousands of junk tags to reach
	// it, small enough that trying them all costs a few MiB and five requests.
	MaxTagCandidates = 4096
	// MaxTagRequests bounds the upload-pack requests that fetch the candidates' tag objects
	// (five suffice for MaxTagCandidates; more are needed only when batches break the pack
	// limits and are fetched again in halves, about 2·log2(16) more for each tag whose tag
	// object or commit is over MaxFileBytes); past it, ErrTooLarge.
	MaxTagRequests = 128
	// MaxSkippedTags bounds Artifact.SkippedTags, and the skipped tags an error lists; the
	// others are only counted (Artifact.SkippedTagsOmitted).
	MaxSkippedTags = 20
)

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
	// With Options.Verify in mode Tag or TagAndHEAD, the highest tag whose signatures verify
	// wins instead, however many tags that do not verify lie above it (see Options.Verify
	// and MaxTagCandidates); a tag whose tag object bears another name (a signed v1.0.0
	// pushed again as refs/tags/v1.9.0) does not verify.
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

// Options describe one fetch. Zero limits mean the defaults; negative ones are
// ErrInvalidOptions.
type Options struct {
	// URL is https://, http://, ssh://[user@]host[:port]/path or file:///abs/path (only with
	// AllowFileURLs). Credentials belong in Auth, not in the URL.
	URL string
	Ref Ref
	// Auth is ignored for file URLs (it must be empty).
	Auth Auth
	// Timeout bounds the whole operation (listing and every fetch); zero means
	// DefaultTimeout. The context's own deadline, if earlier, applies too.
	Timeout time.Duration
	// TempDir is where the artifact's directory (and, for a moment, a copy of known_hosts) is
	// created; empty means os.TempDir().
	TempDir string
	// Path is the folder, slash-separated and relative to the repository root, that
	// Artifact.FS reads: "" or "." is the whole tree. Nothing outside it is read.
	Path string
	// MaxFileBytes bounds one file under Path and one object of any pack the server sends,
	// in bytes (inflated); DefaultMaxFileBytes when zero.
	MaxFileBytes int64
	// MaxTotalBytes bounds the sum of the files under Path (each file or folder counting
	// 256 bytes plus its path besides its content), and the sum of the inflated objects of
	// one pack, in bytes; DefaultMaxTotalBytes when zero.
	MaxTotalBytes int64
	// MaxObjects bounds the number of objects of one pack; DefaultMaxObjects when zero.
	MaxObjects int
	// MaxFiles bounds the entries under Path that Artifact.FS reads: files, folders,
	// symbolic links and submodules, the folders leading to Path included; DefaultMaxFiles
	// when zero. Each entry also counts 256 bytes plus its path against MaxTotalBytes.
	MaxFiles int
	// MaxRefs bounds the ref advertisement of the remote, read on every RemoteRevision and
	// Fetch before anything else: at most MaxRefs refs (pkt-lines: an annotated tag's peeled
	// "^{}" line counts as one more) in at most 256 bytes per ref (plus 64 KiB); the server's
	// answer to each fetch request may exceed the pack limit by that size too (for the
	// shallow and acknowledgement lines). DefaultMaxRefs when zero.
	MaxRefs int
	// MaxCommits bounds the depth, in commits, of the history fetched for Since and for a
	// commit ref; DefaultMaxCommits when zero.
	MaxCommits int
	// AllowFileURLs permits file:// URLs, which read repositories on this machine's disk.
	// Without it a file URL is ErrInvalidOptions.
	AllowFileURLs bool
	// Since is the 40-hex commit applied last, or "" for none (a first apply). When set and
	// different from the fetched commit, the history between them is fetched (commits only)
	// for Artifact.Descends and Verify's ModeChain.
	Since string
	// Verify is the trust that Fetch needs itself: with a SemVer ref and Mode Tag or
	// TagAndHEAD, Fetch tries the tags in the range highest first and takes the first whose
	// signatures verify with Keys (for TagAndHEAD its commit's too), whatever the number of
	// higher tags that do not; those are returned in Artifact.SkippedTags. Lightweight tags
	// are skipped without a fetch; the tag objects and commits (no trees) of the annotated
	// ones are fetched in batches (16, 64, 256, 1024, the rest), each one request bounded
	// like any pack, stopping at the first that verifies: at most MaxTagCandidates
	// annotated tags in at most MaxTagRequests requests (else ErrTooLarge). A batch whose
	// pack breaks a limit is fetched again in halves, and a tag whose own objects break it
	// is skipped. Fetch does not verify otherwise: call Verify on the Artifact. Nil for none.
	Verify *VerifyOptions
}

// VerifyOptions are the mode and trusted keys Fetch uses to choose a semver tag.
type VerifyOptions struct {
	Mode Mode
	Keys *KeyRing
}

// SkippedTag is a tag in the semver range, higher than the one fetched, that was not taken
// because its signatures do not verify (or its objects cannot be fetched within the
// limits).
type SkippedTag struct {
	// Tag is the tag's name, cut to 256 bytes (and "…").
	Tag string
	// Reason says why, e.g. "signed by SSH key SHA256:..., which is not a trusted key"; cut
	// to 512 bytes (and "…").
	Reason string
}

// Artifact is a fetched revision: its git objects in Dir (nothing is checked out). Call
// Cleanup when done with it.
type Artifact struct {
	// Dir holds the objects (a bare repository in Dir/.git); it belongs to the caller.
	Dir string
	// Revision is `<branch or tag>@sha1:<commit>`, or `sha1:<commit>` for a bare commit ref.
	Revision string
	// Commit is the 40-hex SHA-1 of the fetched commit.
	Commit string
	// Tag is the tag name for Tag and SemVer refs, empty otherwise.
	Tag string
	// URL is the remote, without credentials.
	URL string
	// Since is Options.Since (lower-case), "" when none was given.
	Since string
	// SkippedTags are the tags higher than Tag in the semver range whose signatures did not
	// verify, highest first (only with Options.Verify verifying tags): the first
	// MaxSkippedTags of them.
	SkippedTags []SkippedTag
	// SkippedTagsOmitted is how many more tags were skipped, below those listed.
	SkippedTagsOmitted int

	store     *filesystem.Storage
	tagObject plumbing.Hash // the annotated tag object of Tag; zero for a lightweight tag
	path      string        // Options.Path, cleaned ("." for the whole tree)
	maxFile   int64
	maxTotal  int64
	maxFiles  int
	maxWalk   int // bound of history walks (commits)
	depth     int // the depth of the history fetched, 0 when only the commit was fetched
}

// Cleanup removes Dir. It is safe to call more than once and on a nil Artifact.
func (a *Artifact) Cleanup() error {
	if a == nil || a.Dir == "" {
		return nil
	}
	err := os.RemoveAll(a.Dir)
	a.Dir, a.store = "", nil
	return err
}

// prepared is Options after validation: the parsed URL, the go-git auth method and the
// limits with their defaults.
type prepared struct {
	url      string // as given, for go-git
	display  string // redacted, for messages
	scheme   string
	auth     transport.AuthMethod
	http     transport.Transport // go-git's HTTP transport with bounded answers, for http(s)
	release  func()              // releases what http holds (idle connections)
	ref      Ref
	semver   *semver.Constraints
	timeout  time.Duration
	path     string
	maxFile  int64
	maxTotal int64
	maxObj   int
	maxFiles int
	maxRefs  int
	maxDepth int
	since    string
	verify   *VerifyOptions
}

// verifiesTags says whether Fetch must choose a semver tag by its signatures.
func (p *prepared) verifiesTags() bool {
	return p.verify != nil && (p.verify.Mode == ModeTag || p.verify.Mode == ModeTagAndHEAD)
}

// prepare validates o. Errors are ErrInvalidOptions (or ErrInvalidKeys for Verify without
// keys) and say which field to fix.
func prepare(o Options) (*prepared, error) {
	p := &prepared{url: o.URL, ref: o.Ref, timeout: o.Timeout,
		maxFile: o.MaxFileBytes, maxTotal: o.MaxTotalBytes, maxObj: o.MaxObjects, maxFiles: o.MaxFiles, maxRefs: o.MaxRefs, maxDepth: o.MaxCommits, release: func() {}}
	if p.timeout < 0 {
		return nil, optionsError("timeout %s is negative", o.Timeout)
	}
	if p.timeout == 0 {
		p.timeout = DefaultTimeout
	}
	if p.maxFile < 0 || p.maxTotal < 0 || p.maxObj < 0 || p.maxFiles < 0 || p.maxRefs < 0 || p.maxDepth < 0 {
		return nil, optionsError("limits must not be negative (max file %d, max total %d, max objects %d, max files %d, max refs %d, max commits %d)",
			o.MaxFileBytes, o.MaxTotalBytes, o.MaxObjects, o.MaxFiles, o.MaxRefs, o.MaxCommits)
	}
	if p.maxFile == 0 {
		p.maxFile = DefaultMaxFileBytes
	}
	if p.maxTotal == 0 {
		p.maxTotal = DefaultMaxTotalBytes
	}
	if p.maxObj == 0 {
		p.maxObj = DefaultMaxObjects
	}
	if p.maxFiles == 0 {
		p.maxFiles = DefaultMaxFiles
	}
	if p.maxRefs == 0 {
		p.maxRefs = DefaultMaxRefs
	}
	if p.maxDepth == 0 {
		p.maxDepth = DefaultMaxCommits
	}
	var err error
	if p.path, err = cleanPath(o.Path); err != nil {
		return nil, err
	}
	if o.Since != "" {
		p.since = strings.ToLower(o.Since)
		if _, err := hex.DecodeString(p.since); err != nil || len(p.since) != 40 {
			return nil, optionsError("since %q is not a full 40-character SHA-1", o.Since)
		}
	}
	if v := o.Verify; v != nil {
		switch v.Mode {
		case "", ModeHEAD, ModeTag, ModeTagAndHEAD, ModeChain:
		default:
			return nil, optionsError("verify mode %q is not one of HEAD, Tag, TagAndHEAD, Chain", v.Mode)
		}
		if v.Keys.Len() == 0 {
			return nil, &Error{Op: "options", Kind: ErrInvalidKeys, Err: errors.New("verify has no trusted keys")}
		}
		p.verify = v
	}
	if o.URL == "" {
		return nil, optionsError("url is empty")
	}
	u, err := url.Parse(o.URL)
	if err != nil || u.Scheme == "" {
		return nil, optionsError("url %q is not a URL; use https://, ssh://user@host/path or file:///path", o.URL)
	}
	p.display = u.Redacted()
	p.scheme = u.Scheme
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
		if p.http, p.release, err = httpTransport(a.CABundle); err != nil {
			return nil, optionsError("https: %v", err)
		}
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
		if !o.AllowFileURLs {
			return nil, optionsError("file URL %s refused: file:// reads repositories on the controller's own disk, so the controller must be started with --allow-file-urls to use it", p.display)
		}
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

// cleanPath makes Options.Path a valid fs.FS path ("." for the whole tree).
func cleanPath(s string) (string, error) {
	c := path.Clean(strings.TrimPrefix(s, "./"))
	if c == "" || !fs.ValidPath(c) {
		return "", optionsError("path %q must be a folder inside the repository (relative, without .. segments)", s)
	}
	return c, nil
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

// listRefs lists the remote's references (with peeled tags as "refs/tags/x^{}"), reading
// the advertisement within MaxRefs.
func listRefs(ctx context.Context, p *prepared) ([]*plumbing.Reference, error) {
	s, err := openSession(ctx, p)
	if err != nil {
		return nil, err
	}
	defer s.close()
	return s.refs(), nil
}

// resolved is a ref resolved against the remote's advertisement.
type resolved struct {
	name   string // revision prefix: branch or tag name; empty for a bare commit
	tag    string
	hash   string // commit hash (peeled), empty when unknown
	object string // the advertised object: the tag object of an annotated tag, else hash
}

func (r resolved) revision() string {
	if r.name == "" {
		return "sha1:" + r.hash
	}
	return r.name + "@sha1:" + r.hash
}

// annotated says whether the ref is an annotated tag (its object is a tag object).
func (r resolved) annotated() bool { return r.tag != "" && r.object != r.hash }

// advertised indexes refs by name; peeled tags are "refs/tags/x^{}".
type advertised map[string]string

func indexRefs(refs []*plumbing.Reference) advertised {
	byName := make(advertised, len(refs))
	for _, r := range refs {
		if r.Type() == plumbing.HashReference {
			byName[r.Name().String()] = r.Hash().String()
		}
	}
	return byName
}

// tag returns the commit a tag points to (peeled) and the tag's own object ("" when absent).
func (a advertised) tag(tag string) (commit, object string) {
	name := plumbing.NewTagReferenceName(tag).String()
	object = a[name]
	if h, ok := a[name+"^{}"]; ok {
		return h, object
	}
	return object, object
}

// tags lists the tag names.
func (a advertised) tags() []string {
	var tags []string
	for name := range a {
		if t, ok := strings.CutPrefix(name, "refs/tags/"); ok && !strings.HasSuffix(t, "^{}") {
			tags = append(tags, t)
		}
	}
	return tags
}

func notFound(p *prepared, format string, args ...any) error {
	return &Error{Op: "resolve", Subject: p.display, Kind: ErrRefNotFound, Err: fmt.Errorf(format, args...),
		Hint: "check the ref in the spec, or push it"}
}

// resolve finds p.ref in refs. It fails with ErrRefNotFound when the ref is absent. A
// semver ref resolves to the highest matching tag, verified or not.
func resolve(p *prepared, refs []*plumbing.Reference) (resolved, error) {
	byName := indexRefs(refs)
	ref := p.ref
	switch {
	case ref.Commit != "":
		if ref.Branch != "" {
			if _, ok := byName[plumbing.NewBranchReferenceName(ref.Branch).String()]; !ok {
				return resolved{}, notFound(p, "branch %q not found", ref.Branch)
			}
		}
		return resolved{name: ref.Branch, hash: ref.Commit, object: ref.Commit}, nil
	case ref.Branch != "":
		h, ok := byName[plumbing.NewBranchReferenceName(ref.Branch).String()]
		if !ok {
			return resolved{}, notFound(p, "branch %q not found", ref.Branch)
		}
		return resolved{name: ref.Branch, hash: h, object: h}, nil
	case ref.Tag != "":
		h, obj := byName.tag(ref.Tag)
		if h == "" {
			return resolved{}, notFound(p, "tag %q not found", ref.Tag)
		}
		return resolved{name: ref.Tag, tag: ref.Tag, hash: h, object: obj}, nil
	default:
		tags := byName.tags()
		best := matchingTags(p.semver, tags)
		if len(best) == 0 {
			return resolved{}, notFound(p, "no tag matches semver %q (%d tags on the remote)", ref.SemVer, len(tags))
		}
		h, obj := byName.tag(best[0])
		return resolved{name: best[0], tag: best[0], hash: h, object: obj}, nil
	}
}

// highestMatching returns the tag with the highest version satisfying c, or "" if none.
// Tags that do not parse as versions are skipped.
func highestMatching(c *semver.Constraints, tags []string) string {
	if m := matchingTags(c, tags); len(m) > 0 {
		return m[0]
	}
	return ""
}

// matchingTags returns the tags whose version satisfies c, highest first; between tags of
// equal precedence the lexically greatest name comes first. Tags that do not parse as
// versions are skipped.
func matchingTags(c *semver.Constraints, tags []string) []string {
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
	sort.Slice(cands, func(i, j int) bool {
		if c := cands[i].v.Compare(cands[j].v); c != 0 {
			return c > 0
		}
		return cands[i].tag > cands[j].tag
	})
	out := make([]string, len(cands))
	for i, c := range cands {
		out[i] = c.tag
	}
	return out
}

// RemoteRevision returns the revision Fetch would produce now, by listing the remote's refs:
// `main@sha1:<hex>`, `v1.2.0@sha1:<hex>` (the commit an annotated tag points to, as the
// server advertises it peeled), or `sha1:<commit>` / `<branch>@sha1:<commit>` for a commit
// ref (the commit itself is not checked; only that the branch exists). With a semver ref
// and Options.Verify verifying tags it also fetches the candidate tags' objects (no trees)
// into a temporary directory, as Fetch does and within the same bounds, to pick the tag
// Fetch would pick. The reconciler compares it with the last fetched revision to skip a
// fetch.
//
// Errors are *Error: ErrInvalidOptions, ErrInvalidKeys, ErrAuthFailed, ErrHostKey,
// ErrRepositoryNotFound, ErrUnreachable, ErrTimeout, ErrRefNotFound, ErrTooLarge (also:
// none of the MaxTagCandidates highest annotated candidates verifies and there are more),
// ErrVerification (no candidate tag verifies) or ErrFetchFailed.
func RemoteRevision(ctx context.Context, o Options) (string, error) {
	p, err := prepare(o)
	if err != nil {
		return "", err
	}
	if p.ref.SemVer != "" && p.verifiesTags() {
		dir, err := os.MkdirTemp(o.TempDir, "reversi-tags-")
		if err != nil {
			return "", &Error{Op: "list", Subject: p.display, Kind: ErrFetchFailed, Err: err, Hint: "cannot create the temporary directory"}
		}
		rev, opCtx, err := withTimeout(ctx, p.timeout, func(ctx context.Context) (string, error) {
			defer p.release()
			return chooseRemoteTag(ctx, p, dir)
		}, nil)
		if err != nil {
			return "", classify("list", p, err, opCtx, ctx)
		}
		return rev, nil
	}
	refs, opCtx, err := withTimeout(ctx, p.timeout, func(ctx context.Context) ([]*plumbing.Reference, error) {
		defer p.release()
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

// Fetch fetches the objects of o.Ref's commit into a new directory under o.TempDir: see the
// package documentation for what is fetched and which limits apply. Branch and tag refs
// are fetched shallow; a semver ref picks the highest matching tag (with Options.Verify
// verifying tags, the highest that verifies); a commit ref is looked up in the history of
// its branch, or of every branch and tag. With o.Since set, the commit history back to it
// is fetched as well. The whole operation is bounded by o.Timeout and ctx.
//
// On success the caller owns the Artifact and must call Cleanup. On failure nothing is
// left on disk and the error is an *Error matching one of ErrInvalidOptions,
// ErrInvalidKeys, ErrAuthFailed, ErrHostKey, ErrRepositoryNotFound, ErrUnreachable,
// ErrTimeout, ErrRefNotFound, ErrTooLarge (also when none of the MaxTagCandidates highest
// annotated semver candidates verifies and there are more), ErrVerification (only when no
// semver candidate verifies) or ErrFetchFailed. Fetch does not verify the fetched commit:
// call Verify.
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
		defer p.release()
		return fetch(ctx, p, dir)
	}, func(a *Artifact) { _ = a.Cleanup() })
	if err != nil {
		// fetch removes dir when it fails; when it is still running past the deadline, the
		// late callback removes the directory of a fetch that succeeds after all.
		return nil, classify("fetch", p, err, opCtx, ctx)
	}
	return a, nil
}
