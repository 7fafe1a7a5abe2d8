package webhook

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestPostClassifies: a 2xx is delivered with the headers and a valid signature; a 5xx, 408
// and 429 are worth retrying; a 4xx and a redirect are permanent; no error names the URL.
func TestPostClassifies(t *testing.T) {
	var got *http.Request
	var body []byte
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, body = r, nil
		body, _ = io.ReadAll(r.Body)
		if status == http.StatusFound {
			w.Header().Set("Location", "http://127.0.0.1:1/elsewhere")
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, "answer\x01")
	}))
	defer srv.Close()
	c := NewClient(5*time.Second, 1)
	d := Delivery{URL: srv.URL + "/secret-path", Event: "approval.requested", Key: "approval.requested:apr-1", Secret: "k", Body: []byte(`{"a":1}`)}
	if err := Post(context.Background(), c, d, 0); err != nil {
		t.Fatal(err)
	}
	if got.Header.Get(HeaderEvent) != d.Event || got.Header.Get(HeaderIdempotency) != d.Key || string(body) != `{"a":1}` ||
		!Verify("k", body, got.Header.Get(HeaderSignature)) || Verify("other", body, got.Header.Get(HeaderSignature)) {
		t.Fatalf("headers %v body %q", got.Header, body)
	}
	for _, c2 := range []struct {
		status    int
		permanent bool
	}{{500, false}, {503, false}, {408, false}, {429, false}, {400, true}, {404, true}, {http.StatusFound, true}} {
		status = c2.status
		err := Post(context.Background(), c, d, 0)
		if err == nil || IsPermanent(err) != c2.permanent || strings.Contains(err.Error(), "secret-path") || strings.Contains(err.Error(), "\x01") {
			t.Errorf("HTTP %d: %v (permanent %v), want permanent %v without the URL or control bytes", c2.status, err, IsPermanent(err), c2.permanent)
		}
	}
	srv.Close()
	if err := Post(context.Background(), c, d, 0); err == nil || IsPermanent(err) || strings.Contains(err.Error(), "secret-path") {
		t.Errorf("closed receiver: %v, want a retryable error without the URL", err)
	}
}

// TestRetryDelay: the delay doubles from Backoff per failed attempt, stops at MaxBackoff, and
// adds at most 20 % jitter; zero fields are the defaults.
func TestRetryDelay(t *testing.T) {
	r := Retry{Backoff: 100 * time.Millisecond, MaxBackoff: time.Second}
	for attempt, base := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 9: time.Second} {
		for range 20 {
			if d := r.Delay(attempt); d < base || d > base+base/5 {
				t.Fatalf("attempt %d: %s, want %s plus at most 20 %%", attempt, d, base)
			}
		}
	}
	if d := (Retry{}).Delay(1); d < DefaultBackoff || d > DefaultBackoff*6/5 {
		t.Fatalf("the default first delay is %s", d)
	}
}
