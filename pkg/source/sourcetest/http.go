package sourcetest

import (
	"bytes"
	"crypto/subtle"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// HTTPAuth is what the smart-HTTP server demands. The zero value serves anyone.
type HTTPAuth struct {
	// Username and Password, when set, are required as HTTP basic auth.
	Username, Password string
	// BearerToken, when set, is required as "Authorization: Bearer <token>".
	BearerToken string
}

// HTTPServer serves the git repositories under Root over smart HTTP: `git http-backend`
// behind net/http/cgi on 127.0.0.1.
type HTTPServer struct {
	*httptest.Server
	Root string

	auth         HTTPAuth
	fetches      atomic.Int64
	lists        atomic.Int64
	ignoreFilter atomic.Bool
}

// IgnoreFilter makes the server behave like one that advertises partial clone but ignores
// the client's filter: the `filter` line is dropped from every upload-pack request, so the
// pack holds every object asked for.
func (s *HTTPServer) IgnoreFilter() { s.ignoreFilter.Store(true) }

// dropFilter removes the `filter ...` pkt-line from an upload-pack request.
func dropFilter(body []byte) ([]byte, error) {
	var out []byte
	for len(body) > 0 {
		if len(body) < 4 {
			return nil, fmt.Errorf("truncated pkt-line")
		}
		n, err := strconv.ParseUint(string(body[:4]), 16, 16)
		if err != nil {
			return nil, err
		}
		size := int(n)
		if size < 4 { // flush, delim
			size = 4
		}
		if size > len(body) {
			return nil, fmt.Errorf("truncated pkt-line")
		}
		if !strings.HasPrefix(string(body[4:size]), "filter ") {
			out = append(out, body[:size]...)
		}
		body = body[size:]
	}
	return out, nil
}

// ServeHTTP starts a server for every repository under root (GIT_PROJECT_ROOT; all are
// exported). A request without the credentials of auth gets 401. It stops at test end.
func ServeHTTP(t testing.TB, root string, auth HTTPAuth) *HTTPServer {
	t.Helper()
	RequireTools(t, "git")
	gitPath, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	s := &HTTPServer{Root: root, auth: auth}
	backend := &cgi.Handler{
		Path: gitPath,
		Args: []string{"http-backend"},
		Dir:  root,
		Env: []string{
			"GIT_PROJECT_ROOT=" + root,
			"GIT_HTTP_EXPORT_ALL=1",
			"GIT_CONFIG_NOSYSTEM=1",
			"HOME=" + t.TempDir(),
		},
		Stderr: testWriter{t},
	}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.authorized(r) {
			if s.auth.BearerToken != "" {
				w.Header().Set("WWW-Authenticate", `Bearer realm="git"`)
			} else {
				w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			}
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		switch {
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/git-upload-pack"):
			s.fetches.Add(1)
			if s.ignoreFilter.Load() {
				body, err := io.ReadAll(r.Body)
				if err == nil {
					body, err = dropFilter(body)
				}
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
				r.Header.Set("Content-Length", strconv.Itoa(len(body)))
			}
		case strings.HasSuffix(r.URL.Path, "/info/refs"):
			s.lists.Add(1)
		}
		backend.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *HTTPServer) authorized(r *http.Request) bool {
	eq := func(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }
	switch {
	case s.auth.BearerToken != "":
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		return ok && eq(tok, s.auth.BearerToken)
	case s.auth.Username != "" || s.auth.Password != "":
		u, p, ok := r.BasicAuth()
		return ok && eq(u, s.auth.Username) && eq(p, s.auth.Password)
	}
	return true
}

// testWriter sends http-backend's stderr to the test log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("git http-backend: %s", strings.TrimSpace(string(p)))
	return len(p), nil
}

// RepoURL is the URL of the repository at dir, which must be under Root.
func (s *HTTPServer) RepoURL(t testing.TB, dir string) string {
	t.Helper()
	rel, err := filepath.Rel(s.Root, dir)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		t.Fatalf("%s is not under the served root %s", dir, s.Root)
	}
	return s.URL + "/" + filepath.ToSlash(rel)
}

// Fetches counts the authorized upload-pack requests (clones and fetches, not listings).
func (s *HTTPServer) Fetches() int64 { return s.fetches.Load() }

// Lists counts the authorized ref advertisements (/info/refs): one per listing or clone.
func (s *HTTPServer) Lists() int64 { return s.lists.Load() }

// StallingServer is an HTTP server on 127.0.0.1 whose handler never answers: it waits until
// the client goes away or the test ends. Use it to test timeouts.
func StallingServer(t testing.TB) *httptest.Server {
	t.Helper()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs before srv.Close (cleanups are LIFO)
	return srv
}

// ClosedPortURL returns an http URL on 127.0.0.1 at a port that was just free: connecting
// to it is refused.
func ClosedPortURL(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return "http://" + addr + "/repo"
}
