package proxy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/gateway/config"
)

// TestAttackRedirectLocationEchoed: the refused redirect's error carries the Location the
// upstream chose (net/http puts it whole in the url.Error). A url upstream answering a call
// with a 307 whose Location is ~1 MiB long, with a bidi override in the host, had all of it
// in the agent's result. The result names the redirect's target cut short and escaped.
func TestAttackRedirectLocationEchoed(t *testing.T) {
	target, err := url.Parse(hostileHTTP(t))
	if err != nil {
		t.Fatal(err)
	}
	loc := "http://evil\u202e.example:1/" + strings.Repeat("A", 1<<20) + "?x=\u202e"
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: target.Scheme, Host: target.Host})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if bytes.Contains(body, []byte(`"redirect me"`)) {
			w.Header().Set("Location", loc)
			w.WriteHeader(http.StatusTemporaryRedirect)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	defer front.Close()
	cfg := &config.Gateway{Mode: config.ModeAuto, UnclassifiedReads: config.UnclassifiedBlock, ValidateSchemas: true,
		Actor: "dev-laptop", Upstreams: []config.Upstream{{Name: "h", URL: front.URL + target.Path, Namespace: true}}}
	h := startUpstreamGW(t, cfg)
	res := call(t, h.client(t), "h.echo", map[string]any{"text": "redirect me"})
	got := strings.Join(texts(res), "")
	if !res.IsError || !strings.Contains(got, "redirects are not followed") {
		t.Fatalf("result %.300q", got)
	}
	if !strings.Contains(got, `redirecting to "http://evil\u202e.example:1"`) {
		t.Errorf("the target is not named: %.300q", got)
	}
	if len(got) > 4096 {
		t.Errorf("the result has %d bytes of the upstream's Location", len(got))
	}
	if strings.ContainsRune(got, '\u202e') || strings.ContainsRune(h.stderr.String(), '\u202e') {
		t.Errorf("a bidi override of the Location reached the result or stderr: %.300q", got)
	}
}
