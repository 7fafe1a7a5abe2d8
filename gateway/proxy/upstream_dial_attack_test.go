package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestUpstreamDialChecksTheAddress: the egress check at start resolves a url upstream's name
// once; the connection resolves it again, so a name answering a public address to the check
// and a private (or metadata) one to the dial would pass (DNS rebinding). The upstream's
// transport checks the address it dials: under block_private a loopback server is refused
// at the dial, and reached without it. (No test can make the system resolver answer a
// different address the second time: the dial's check is exercised directly.)
func TestUpstreamDialChecksTheAddress(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	defer srv.Close()
	get := func(rt http.RoundTripper) error {
		req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := rt.RoundTrip(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		return err
	}
	if err := get(upstreamHTTP(true)); err == nil || !strings.Contains(err.Error(), "private address") {
		t.Errorf("block_private: a loopback address was dialled: %v", err)
	}
	if err := get(upstreamHTTP(false)); err != nil {
		t.Errorf("without block_private: %v", err)
	}
}
