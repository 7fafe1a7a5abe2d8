package source_test

import (
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/pkg/source"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

// advertisedRefs is how many refs the hostile server advertises.
const advertisedRefs = 1_500_000

// ATTACK (hostile git server, or anyone who may set spec.url; also a pusher who creates many
// tags): the ref advertisement is not bounded. RemoteRevision runs on every reconcile, before
// any limit is checked, and go-git reads the whole advertisement into a map and then a slice.
// This server answers /info/refs with 1.5 million refs, gzip-encoded (Go's HTTP client
// inflates it transparently), 3.8 MB on the wire. The test measures the peak RSS of a
// child process that does only this (VmHWM), so earlier tests cannot hide it.
func TestHugeRefAdvertisementIsNotBounded(t *testing.T) {
	if os.Getenv("REDTEAM_REFS_CHILD") != "" {
		t.Skip("the child runs TestHugeRefAdvertisementChild")
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/info/refs") {
			http.Error(w, "no", http.StatusForbidden)
			return
		}
		w.Header().Set("Content-Type", "application/x-git-upload-pack-advertisement")
		w.Header().Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(w)
		defer gz.Close()
		b := bufio.NewWriter(gz)
		defer b.Flush()
		pkt := func(s string) { fmt.Fprintf(b, "%04x%s", len(s)+4, s) }
		pkt("# service=git-upload-pack\n")
		b.WriteString("0000")
		h := strings.Repeat("ab", 20)
		pkt(h + " refs/heads/main\x00ofs-delta side-band-64k shallow no-progress\n")
		for i := 0; i < advertisedRefs; i++ {
			pkt(h + " refs/tags/v0.0." + strconv.Itoa(i) + "\n")
		}
		b.WriteString("0000")
	}))
	defer srv.Close()

	cmd := exec.Command(os.Args[0], "-test.run=^TestHugeRefAdvertisementChild$", "-test.v")
	cmd.Env = append(os.Environ(), "REDTEAM_REFS_CHILD="+srv.URL+"/repo.git")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var before, after int64
	for _, line := range strings.Split(string(out), "\n") {
		if _, err := fmt.Sscanf(strings.TrimSpace(line), "rss-kib %d %d", &before, &after); err == nil {
			break
		}
	}
	if before == 0 {
		t.Fatalf("no measurement from the child:\n%s", out)
	}
	if grew := (after - before) >> 10; grew > 64 {
		t.Fatalf("listing a hostile server's %d refs raised the controller's peak RSS by %d MiB (from %d MiB): bound the advertisement (refs and bytes) before parsing it, e.g. a --source-max-refs limit",
			advertisedRefs, grew, before>>10)
	}
}

// TestHugeRefAdvertisementChild runs in the child process only.
func TestHugeRefAdvertisementChild(t *testing.T) {
	url := os.Getenv("REDTEAM_REFS_CHILD")
	if url == "" {
		t.Skip("only as the child of TestHugeRefAdvertisementIsNotBounded")
	}
	before := peakRSS(t)
	_, err := source.RemoteRevision(context.Background(), source.Options{URL: url, Ref: source.Ref{Branch: "main"}})
	fmt.Printf("rss-kib %d %d\n", before, peakRSS(t))
	t.Logf("RemoteRevision: %v", err)
}

func peakRSS(t *testing.T) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// The honest path, over every transport: an advertisement of exactly MaxRefs refs (HEAD,
// main and 30 tags) lists and fetches; one ref fewer allowed is ErrTooLarge naming the limit.
func TestRefAdvertisementLimitOnEveryTransport(t *testing.T) {
	r := sourcetest.NewRepo(t)
	r.WriteFile("reg/a.yaml", "a")
	r.Commit("one")
	for i := 0; i < 30; i++ {
		r.Tag(fmt.Sprintf("v0.0.%d", i))
	}
	const refs = 32 // HEAD, refs/heads/main, 30 lightweight tags
	httpSrv := sourcetest.ServeHTTP(t, filepath.Dir(r.Dir), sourcetest.HTTPAuth{})
	key := sourcetest.NewSSHKey(t)
	sshSrv := sourcetest.ServeSSH(t, filepath.Dir(r.Dir), key.Public)
	for scheme, o := range map[string]source.Options{
		"file": {URL: r.FileURL(), AllowFileURLs: true},
		"http": {URL: httpSrv.RepoURL(t, r.Dir)},
		"ssh":  {URL: sshSrv.RepoURL(t, r.Dir), Auth: source.Auth{Identity: key.PrivateKey, KnownHosts: sshSrv.KnownHosts}},
	} {
		t.Run(scheme, func(t *testing.T) {
			o.Timeout, o.MaxRefs = 20*time.Second, refs
			for _, ref := range []source.Ref{{Branch: "main"}, {SemVer: "0.0.x"}} {
				o.Ref = ref
				a := fetch(t, o)
				if rev, err := source.RemoteRevision(context.Background(), o); err != nil || rev != a.Revision {
					t.Fatalf("%+v: RemoteRevision %q %v, fetched %q", ref, rev, err, a.Revision)
				}
				if ref.SemVer != "" && a.Tag != "v0.0.29" {
					t.Fatalf("semver fetched %s", a.Revision)
				}
			}
			o.MaxRefs = refs - 1
			_, err := source.RemoteRevision(context.Background(), o)
			assertKind(t, err, source.ErrTooLarge, fmt.Sprintf("more than %d refs", refs-1), "--source-max-refs")
			_, err = source.Fetch(context.Background(), o)
			assertKind(t, err, source.ErrTooLarge, fmt.Sprintf("more than %d refs", refs-1))
		})
	}
	if source.DefaultMaxRefs < 10_000 {
		t.Fatalf("DefaultMaxRefs %d", source.DefaultMaxRefs)
	}
}

// A hostile HTTP server within the ref count is still bounded: a few refs with huge names
// break the advertisement's byte limit, an endless list of shallow lines in answer to the
// fetch breaks the answer's, and a huge error page is cut short.
func TestHostileHTTPAnswersAreBounded(t *testing.T) {
	h := strings.Repeat("ab", 20)
	pkt := func(w io.Writer, s string) { fmt.Fprintf(w, "%04x%s", len(s)+4, s) }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mode := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")[0]
		if mode == "error" {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			w.WriteHeader(http.StatusUnauthorized)
			io.Copy(w, io.LimitReader(filler{}, 32<<20))
			return
		}
		if strings.HasSuffix(r.URL.Path, "/info/refs") {
			w.Header().Set("Content-Type", "application/x-git-upload-pack-advertisement")
			pkt(w, "# service=git-upload-pack\n")
			io.WriteString(w, "0000")
			pkt(w, h+" refs/heads/main\x00ofs-delta side-band-64k shallow no-progress\n")
			if mode == "long" {
				for i := 0; i < 100; i++ {
					pkt(w, h+" refs/tags/"+strings.Repeat("x", 60000)+strconv.Itoa(i)+"\n")
				}
			}
			io.WriteString(w, "0000")
			return
		}
		w.Header().Set("Content-Type", "application/x-git-upload-pack-result")
		bw := bufio.NewWriter(w)
		defer bw.Flush()
		for i := 0; i < 2_000_000; i++ { // 104 MB of "shallow <hash>"
			pkt(bw, "shallow "+h+"\n")
		}
	}))
	defer srv.Close()

	o := source.Options{URL: srv.URL + "/long/repo.git", Ref: source.Ref{Branch: "main"}, MaxRefs: 100}
	_, err := source.RemoteRevision(context.Background(), o)
	assertKind(t, err, source.ErrTooLarge, "ref advertisement is larger than 89 KiB", "100 refs (--source-max-refs)")

	o = source.Options{URL: srv.URL + "/shallow/repo.git", Ref: source.Ref{Branch: "main"}, MaxTotalBytes: 1 << 20}
	if rev, err := source.RemoteRevision(context.Background(), o); err != nil || rev != "main@sha1:"+h {
		t.Fatalf("RemoteRevision %q %v", rev, err)
	}
	_, err = source.Fetch(context.Background(), o)
	assertKind(t, err, source.ErrTooLarge, "in answer to a fetch request", "--source-max-total-bytes")

	o.URL = srv.URL + "/error/repo.git"
	_, err = source.RemoteRevision(context.Background(), o)
	if !errors.Is(err, source.ErrAuthFailed) || len(err.Error()) > 8<<10 {
		t.Fatalf("want ErrAuthFailed with at most 8 KiB of the server's 32 MiB answer, got %d bytes: %.200v", len(err.Error()), err)
	}
}

// filler reads as an endless run of 'x'.
type filler struct{}

func (filler) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}
