package source_test

import (
	"bufio"
	"compress/gzip"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/internal/source"
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
