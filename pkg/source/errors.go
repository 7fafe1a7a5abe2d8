package source

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/skeema/knownhosts"
)

// Sentinel errors: every error returned by this package matches (errors.Is) exactly one of
// them, so a caller can choose a condition reason and decide whether a retry can help.
//
// Permanent until the spec or a Secret changes: ErrInvalidOptions, ErrInvalidKeys.
// Usually fixed on the remote or in the credentials; retrying is reasonable:
// ErrAuthFailed, ErrHostKey, ErrRepositoryNotFound, ErrRefNotFound, ErrUnreachable,
// ErrTimeout, ErrFetchFailed. ErrVerification means the fetched revision must not be used.
// ErrTooLarge is fixed in the repository (or by raising a limit).
var (
	// ErrInvalidOptions: the Options cannot work as given (no ref or several, bad URL or
	// scheme, ssh without known_hosts, credentials that do not fit the scheme, a malformed
	// private key, a semver range that does not parse, a commit that is not a full SHA).
	ErrInvalidOptions = errors.New("invalid source options")
	// ErrAuthFailed: the server refused the credentials (HTTP 401/403, SSH public key
	// rejected).
	ErrAuthFailed = errors.New("authentication failed")
	// ErrHostKey: the SSH server's host key is not in known_hosts or differs from it.
	ErrHostKey = errors.New("ssh host key not trusted")
	// ErrRepositoryNotFound: the server answered but has no repository at that path.
	ErrRepositoryNotFound = errors.New("repository not found")
	// ErrUnreachable: no answer from the server (connection refused, DNS, network, TLS).
	ErrUnreachable = errors.New("remote unreachable")
	// ErrTimeout: the operation did not finish within Options.Timeout.
	ErrTimeout = errors.New("timed out")
	// ErrRefNotFound: the branch, tag or commit does not exist on the remote, no tag matches
	// the semver range, or the repository is empty.
	ErrRefNotFound = errors.New("reference not found")
	// ErrFetchFailed: any other failure while talking to the remote or reading the objects.
	ErrFetchFailed = errors.New("fetch failed")
	// ErrTooLarge: a limit was hit: a file under Options.Path is larger than
	// Options.MaxFileBytes (or the server's filter left it out for that reason), the files
	// under Path total more than Options.MaxTotalBytes or number more than Options.MaxFiles,
	// the remote advertises more refs than Options.MaxRefs allows, a pack the server sent breaks a
	// limit (one object, the sum of the objects, their count, the compressed size), the
	// history needed for an ancestry check is longer than Options.MaxCommits, or a semver
	// ref with verified tags finds no tag that verifies within MaxTagCandidates annotated
	// tags or MaxTagRequests requests.
	ErrTooLarge = errors.New("over the size limit")
	// ErrVerification: a commit or tag signature is missing, made by an untrusted key,
	// invalid (tampered), of an unsupported kind, or the mode needs a tag that is absent.
	ErrVerification = errors.New("signature verification failed")
	// ErrInvalidKeys: the verification keys (Secret data) cannot be parsed or hold no key.
	ErrInvalidKeys = errors.New("invalid verification keys")
)

// Error is the error type of this package. Kind is one of the sentinels above; Err, when
// set, is the underlying cause (a go-git, network or crypto error). errors.Is matches both.
// Error() reads "<op> <subject>: <kind>: <cause> (<hint>)"; URLs never carry credentials.
type Error struct {
	Op      string // "fetch", "list", "options", "verify", "keys", "read", "ancestry"
	Subject string // the URL (redacted), or the commit/tag being verified, or the key entry
	Kind    error
	Err     error
	Hint    string // what to do about it
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Op)
	if e.Subject != "" {
		b.WriteString(" " + e.Subject)
	}
	b.WriteString(": ")
	kind := ""
	if e.Kind != nil {
		kind = e.Kind.Error()
		b.WriteString(kind)
	}
	if e.Err != nil {
		// Causes may carry a server's multi-line answer; keep the message on one line.
		cause := strings.TrimSuffix(strings.Join(strings.Fields(e.Err.Error()), " "), ":")
		if cause != "" && cause != kind {
			b.WriteString(": " + cause)
		}
	}
	if e.Hint != "" {
		b.WriteString(" (" + e.Hint + ")")
	}
	return b.String()
}

// Unwrap returns the sentinel and the cause, for errors.Is and errors.As.
func (e *Error) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

func optionsError(format string, args ...any) error {
	return &Error{Op: "options", Kind: ErrInvalidOptions, Err: fmt.Errorf(format, args...)}
}

// classify maps an error from go-git (or from our own ref resolution) to an *Error with a
// sentinel and a hint. ctx is the operation's context (with the timeout applied) and parent
// the caller's: a deadline of ours is ErrTimeout, a cancellation by the caller stays
// context.Canceled (wrapped in ErrFetchFailed).
func classify(op string, p *prepared, err error, ctx, parent context.Context) error {
	subject := p.display
	var se *Error
	if errors.As(err, &se) {
		return err
	}
	e := &Error{Op: op, Subject: subject, Err: err}
	var netErr net.Error
	var dnsErr *net.DNSError
	var opErr *net.OpError
	var httpStatus interface{ StatusCode() int }
	switch {
	case parent.Err() != nil && !errors.Is(parent.Err(), context.DeadlineExceeded):
		e.Kind, e.Hint = ErrFetchFailed, "the operation was cancelled"
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded),
		errors.Is(err, context.DeadlineExceeded):
		e.Kind, e.Hint = ErrTimeout, "the remote is slow or stalled; raise the timeout or check the server"
	case errors.Is(err, transport.ErrAuthenticationRequired) && p.auth == nil:
		e.Kind, e.Hint = ErrAuthFailed, "the server wants credentials; set a secretRef with username/password or bearerToken"
	case errors.Is(err, transport.ErrAuthenticationRequired):
		e.Kind, e.Hint = ErrAuthFailed, "the server refused the credentials; check username/password or bearerToken in the secret"
	case errors.Is(err, transport.ErrAuthorizationFailed):
		e.Kind, e.Hint = ErrAuthFailed, "the credentials were refused or lack read access; check the secret"
	case knownhosts.IsHostKeyChanged(err):
		e.Kind, e.Hint = ErrHostKey, "the server's host key differs from known_hosts; if the change is expected, update known_hosts in the secret"
	case knownhosts.IsHostUnknown(err):
		e.Kind, e.Hint = ErrHostKey, "the server is not in known_hosts; add its host key (ssh-keyscan) to known_hosts in the secret"
	// golang.org/x/crypto/ssh's client reports every refused identity with
	// fmt.Errorf("ssh: unable to authenticate, attempted methods …") (client_auth.go, v0.56):
	// there is no typed error or sentinel to match (ssh.ServerAuthError is the server side's),
	// and go-git passes it on as is. The text is the library's, not ours;
	// TestSSH ("a key the server does not know") fails if an upgrade changes it.
	case strings.Contains(err.Error(), "ssh: unable to authenticate"):
		e.Kind, e.Hint = ErrAuthFailed, "the server refused the ssh identity; check identity in the secret and the deploy key on the server"
	case errors.Is(err, transport.ErrRepositoryNotFound):
		e.Kind, e.Hint = ErrRepositoryNotFound, "check the URL and that the credentials can see the repository"
	case errors.Is(err, transport.ErrEmptyRemoteRepository):
		e.Kind, e.Hint = ErrRefNotFound, "the repository is empty; push a commit"
	case errors.Is(err, git.NoMatchingRefSpecError{}),
		errors.Is(err, plumbing.ErrReferenceNotFound),
		errors.Is(err, plumbing.ErrObjectNotFound):
		e.Kind, e.Hint = ErrRefNotFound, "check the ref in the spec"
	case errors.As(err, &httpStatus) && httpStatus.StatusCode() == 404:
		e.Kind, e.Hint = ErrRepositoryNotFound, "check the URL"
	case errors.As(err, &httpStatus):
		e.Kind, e.Hint = ErrFetchFailed, fmt.Sprintf("the server answered HTTP %d", httpStatus.StatusCode())
	case errors.As(err, &dnsErr), errors.As(err, &opErr), errors.Is(err, syscall.ECONNREFUSED),
		errors.As(err, &netErr):
		e.Kind, e.Hint = ErrUnreachable, "check the URL, DNS and network policy; the controller retries"
	default:
		var ue *url.Error
		if errors.As(err, &ue) {
			e.Kind, e.Hint = ErrUnreachable, "check the URL, DNS, TLS and network policy; the controller retries"
		} else {
			e.Kind = ErrFetchFailed
		}
	}
	return e
}
