package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// TestUpstreamProxyUnderBlockPrivate: url upstreams use the environment's HTTP(S)_PROXY, and
// the dial check applied to the proxy's address: under block_private a proxy on a private
// address (as most are) refused every url upstream. The proxy is the operator's, not a
// destination: it is dialled (a metadata address still refused), and it resolves the
// upstream's name itself. A direct connection to a private address is still refused.
func TestUpstreamProxyUnderBlockPrivate(t *testing.T) {
	var via string
	proxySrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		via = r.URL.String() // a forward proxy is asked for the absolute URL
		_, _ = io.WriteString(w, "proxied")
	}))
	defer proxySrv.Close()
	pu, err := url.Parse(proxySrv.URL)
	if err != nil {
		t.Fatal(err)
	}
	rt := newUpstreamHTTP(true, func(r *http.Request) (*url.URL, error) {
		if r.URL.Hostname() == "upstream.example" {
			return pu, nil
		}
		return nil, nil
	})
	get := func(u string) (string, error) {
		req, err := http.NewRequest(http.MethodGet, u, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	if got, err := get("http://upstream.example/mcp"); err != nil || got != "proxied" || via != "http://upstream.example/mcp" {
		t.Errorf("through a loopback proxy under block_private: %q %v (proxy asked for %q)", got, err, via)
	}
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "direct") }))
	defer other.Close()
	if _, err := get(other.URL); err == nil || !strings.Contains(err.Error(), "private address") {
		t.Errorf("a direct connection to a loopback address under block_private: %v", err)
	}
}
