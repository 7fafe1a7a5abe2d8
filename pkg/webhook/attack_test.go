package webhook

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestAttackURLInErrors (issue 24, red team): a Slack URL is the secret of its channel, and a
// failed attempt's error is logged and stored (`reversi notifications list` shows it). The
// error of a transport failure names the URL as net/http re-encoded it, which is not the
// configured text when the scheme has capitals, the URL has a password (shown as ***, the
// rest of it in clear), or the path is re-escaped: the replacement of the configured text
// missed it. No form of the secret path may appear.
func TestAttackURLInErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens: every attempt is a transport error
	const token = "T0SECRET/B0SECRET/XoXoSecretPath"
	for _, u := range []string{
		"HTTPS://" + addr + "/services/" + token,
		"http://" + addr + "/services/" + token,
		"http://user:pw@" + addr + "/services/" + token,
		"http://" + addr + "/services/" + token + "/%7e",
		"http://" + addr + "/services/" + token + "?a=b c",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := Post(ctx, NewClient(time.Second, 1), Delivery{URL: u, Event: "e", Key: "k", Body: []byte(`{}`)}, 0)
		cancel()
		if err == nil {
			t.Fatalf("%s: delivered", u)
		}
		if strings.Contains(err.Error(), "SECRET") || strings.Contains(err.Error(), "pw") {
			t.Errorf("%s: the error carries the URL: %v", u, err)
		}
		if !strings.Contains(err.Error(), "<receiver url>") && !strings.Contains(err.Error(), "request:") {
			t.Errorf("%s: %v", u, err)
		}
	}
}

// TestAttackHostileReceivers (issue 24, red team; held): a receiver that redirects to another
// address (not followed: the other gets nothing, the error is permanent), answers an endless
// body (at most 2 × ReadLimit read, the answer returns at once), drips its body forever, or
// never answers (both end at the client's timeout).
func TestAttackHostileReceivers(t *testing.T) {
	other := make(chan struct{}, 1)
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { other <- struct{}{} }))
	defer target.Close()
	endless := func(code int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(code)
			chunk := []byte(strings.Repeat("x", 32<<10))
			for r.Context().Err() == nil {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}
	}
	for _, c := range []struct {
		name     string
		h        http.HandlerFunc
		ok, perm bool
		atMost   time.Duration
	}{
		{"redirect", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target.URL, http.StatusTemporaryRedirect)
		}, false, true, time.Second},
		{"endless 200", endless(200), true, false, time.Second},
		{"endless 500", endless(500), false, false, time.Second},
		{"drip", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(500)
			for r.Context().Err() == nil {
				if _, err := w.Write([]byte("x")); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				time.Sleep(100 * time.Millisecond)
			}
		}, false, false, 2 * time.Second},
		{"silent", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body) // so that the server notices the client leave
			<-r.Context().Done()
		}, false, false, 2 * time.Second},
	} {
		srv := httptest.NewServer(c.h)
		start := time.Now()
		err := Post(context.Background(), NewClient(time.Second, 1), Delivery{URL: srv.URL, Event: "e", Key: "k", Body: []byte(`{}`)}, 0)
		took := time.Since(start)
		srv.CloseClientConnections()
		srv.Close()
		if (err == nil) != c.ok || IsPermanent(err) != c.perm || took > c.atMost {
			t.Errorf("%s: %v (permanent %v) after %s", c.name, err, IsPermanent(err), took)
		}
	}
	select {
	case <-other:
		t.Error("the redirect was followed")
	default:
	}
}

// TestAttackAnswerSpoofsTheTerminal (red team, issue 24): a receiver's answer is kept as the
// row's last error and printed by `reversi notifications list` in the operator's terminal.
// C0 controls were replaced; a UTF-8 C1 CSI (U+009B) and the bidi override U+202E (which
// reorders the rest of the line) passed. None of them reaches the error now; the honest text
// stays.
func TestAttackAnswerSpoofsTheTerminal(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte("bad request \u009b2J\u202edelivered\u200b \x1b[31m\xff"))
	}))
	defer srv.Close()
	err := Post(context.Background(), NewClient(time.Second, 1), Delivery{URL: srv.URL, Event: "e", Key: "k", Body: []byte(`{}`)}, 0)
	if err == nil {
		t.Fatal("delivered")
	}
	for _, bad := range []string{"\u009b", "\u202e", "\u200b", "\x1b", "\xff"} {
		if strings.Contains(err.Error(), bad) {
			t.Errorf("the error carries %q: %q", bad, err.Error())
		}
	}
	if !strings.Contains(err.Error(), "HTTP 400: bad request") {
		t.Errorf("%q", err.Error())
	}
}
