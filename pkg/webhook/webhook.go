// Package webhook posts one signed JSON notification to a receiver: the delivery primitive
// that the gateway's outbox worker (gateway/notify) and the controller's rendering alerts
// share.
//
// A delivery is a POST with Content-Type application/json, X-Reversi-Event (the event type),
// Idempotency-Key (the same on every attempt: receivers deduplicate by it) and, when the
// receiver has a secret, X-Reversi-Signature: "sha256=" and the hex HMAC-SHA256 of the body
// keyed with the secret. Redirects are not followed, no proxy is taken from the environment,
// and at most ReadLimit bytes of an answer are read.
//
// Post classifies failures: a *PermanentError is one a retry cannot help (a redirect, a 4xx
// other than 408 and 429, a request that cannot be built); any other error (a transport
// error, 5xx, 408, 429) is worth retrying. Errors never contain the receiver's URL (a Slack
// URL is a secret).
//
// Source: issue 24 (Providers: the generic webhook).
package webhook

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"
	"unicode"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reversi-gitops/reversi/pkg/dialguard"
)

// The headers of a delivery.
const (
	HeaderSignature   = "X-Reversi-Signature"
	HeaderEvent       = "X-Reversi-Event"
	HeaderIdempotency = "Idempotency-Key"
)

// DefaultReadLimit is how much of an answer is read (bytes), for the error message.
const DefaultReadLimit = 4 << 10

// Delivery is one POST.
type Delivery struct {
	// URL is the receiver's (http or https).
	URL string
	// Event is X-Reversi-Event, Key the Idempotency-Key.
	Event, Key string
	// Secret signs the body (X-Reversi-Signature); "" sends no signature.
	Secret string
	// Body is the JSON body.
	Body []byte
	// UserAgent defaults to "reversi".
	UserAgent string
}

// PermanentError is a failed delivery that a retry cannot help.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// IsPermanent reports whether err (from Post) is a *PermanentError.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// NewClient is the client deliveries use: timeout bounds connect, TLS, the answer's headers
// and the whole exchange; at most idlePerHost idle connections are kept per host; no proxy
// from the environment; redirects are returned, not followed.
func NewClient(timeout time.Duration, idlePerHost int) *http.Client {
	return NewGuardedClient(timeout, idlePerHost, nil)
}

// NewGuardedClient is NewClient whose every connection is first shown to allow (nil: none),
// with the address it is about to connect to: a non-nil error refuses the connection. The
// check runs on the address the dialer resolved, not on an earlier lookup of the name, so a
// name that resolves to an allowed address when it is checked and to a refused one when it is
// dialled (DNS rebinding) is refused.
func NewGuardedClient(timeout time.Duration, idlePerHost int, allow func(netip.Addr) error) *http.Client {
	dialer := dialguard.Dialer(timeout, allow)
	return &http.Client{Timeout: timeout,
		Transport: &http.Transport{Proxy: nil, DialContext: dialer.DialContext,
			MaxIdleConnsPerHost: idlePerHost, IdleConnTimeout: 90 * time.Second, ResponseHeaderTimeout: timeout,
			TLSHandshakeTimeout: timeout},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// Post makes one attempt at d with client, reading at most readLimit bytes of the answer
// (<= 0: DefaultReadLimit). It returns nil on a 2xx answer, a *PermanentError when a retry
// cannot help, or another error worth retrying.
func Post(ctx context.Context, client *http.Client, d Delivery, readLimit int64) error {
	if readLimit <= 0 {
		readLimit = DefaultReadLimit
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL, bytes.NewReader(d.Body))
	if err != nil {
		return &PermanentError{fmt.Errorf("request: %v", redactURL(err, d.URL))}
	}
	ua := d.UserAgent
	if ua == "" {
		ua = "reversi"
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", ua)
	req.Header.Set(HeaderEvent, d.Event)
	req.Header.Set(HeaderIdempotency, d.Key)
	if d.Secret != "" {
		req.Header.Set(HeaderSignature, Sign(d.Secret, d.Body))
	}
	resp, err := client.Do(req)
	if err != nil {
		return redactURL(err, d.URL)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, readLimit))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, readLimit)) // a little more, for keep-alive
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, printable(answer))
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return &PermanentError{fmt.Errorf("%w (redirects are not followed: configure the final URL)", err)}
	case resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusRequestTimeout && resp.StatusCode != http.StatusTooManyRequests:
		return &PermanentError{err}
	}
	return err
}

// Sign is the X-Reversi-Signature of body: "sha256=" and the hex HMAC-SHA256 of body keyed
// with secret.
func Sign(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Verify reports whether signature is body's X-Reversi-Signature under secret (constant time).
func Verify(secret string, body []byte, signature string) bool {
	return hmac.Equal([]byte(Sign(secret, body)), []byte(signature))
}

// redactURL keeps the URL out of a transport error. A *url.Error names the request's URL as
// net/http re-encoded it (scheme lowercased, password replaced by ***, path re-escaped), which
// need not be the configured text, so its URL is dropped whole; the configured text and its
// re-encoded form are replaced in what remains too.
func redactURL(err error, u string) error {
	msg := err.Error()
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		msg = ue.Op + " <receiver url>: " + ue.Err.Error()
	}
	msg = strings.ReplaceAll(msg, u, "<receiver url>")
	if p, perr := url.Parse(u); perr == nil {
		for _, form := range []string{p.String(), p.Redacted()} {
			if form != "" {
				msg = strings.ReplaceAll(msg, form, "<receiver url>")
			}
		}
	}
	return errors.New(msg)
}

// printable is at most 200 bytes of an answer, control and format characters replaced.
func printable(b []byte) string {
	if len(b) > 200 {
		b = b[:200]
	}
	out := []rune(strings.ToValidUTF8(string(b), "?"))
	for i, r := range out {
		// C0 and C1 controls (a UTF-8 CSI, U+009B, is an escape sequence to some terminals),
		// and format characters such as the bidi overrides (U+202E would reorder what
		// `reversi notifications list` prints after it)
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			out[i] = ' '
		}
	}
	return string(out)
}

// DefaultTimeout bounds one delivery (connect, send, the answer) when the caller sets none.
const DefaultTimeout = 10 * time.Second

// Retry is the backoff of a notification: after the attempt-th failed attempt it is due
// again after Delay(attempt); the caller dead-letters it after its MaxAttempts (default
// DefaultMaxAttempts).
type Retry struct {
	// Backoff is the first retry's delay, doubled each attempt up to MaxBackoff.
	Backoff, MaxBackoff time.Duration
}

// The default retry policy of the gateway's outbox and of the controller's alerts: 1 s
// doubling to 5 min, 8 attempts (about 4 minutes of retries in all).
const (
	DefaultBackoff     = time.Second
	DefaultMaxBackoff  = 5 * time.Minute
	DefaultMaxAttempts = 8
)

// Delay is the wait after the attempt-th failed attempt (attempt >= 1): Backoff doubled
// attempt-1 times, at most MaxBackoff, plus up to 20 % jitter (k8s.io/apimachinery's
// wait.Backoff). Zero fields take the defaults.
func (r Retry) Delay(attempt int) time.Duration {
	base := cmp.Or(r.Backoff, DefaultBackoff)
	b := wait.Backoff{Duration: base, Factor: 2, Jitter: 0.2, Steps: max(attempt, 1), Cap: max(cmp.Or(r.MaxBackoff, DefaultMaxBackoff), base)}
	var d time.Duration
	for range max(attempt, 1) {
		d = b.Step()
	}
	return d
}
