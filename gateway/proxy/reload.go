package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// LoadFunc re-reads the manifests (and with them the trusted manifest keys) for a reload. It
// returns every problem at once; any error refuses the reload.
type LoadFunc func(ctx context.Context) ([]*manifest.Manifest, error)

// ReloadResult is what one reload did (seed: `reversi.reload` returns {changed, tools,
// policy_checksum, error?}). Checksum is SetChecksum of the manifests now served.
type ReloadResult struct {
	Changed  bool
	Tools    int    // manifests now served
	Checksum string // "sha256:<hex>"
	Err      error  // the load failed: the previous manifests keep serving
}

// SetChecksum is the checksum of a manifest set: "sha256:<hex>" over the sorted lines
// "<tool> <manifest checksum>", so it does not depend on file order or layout.
func SetChecksum(sums map[*manifest.Manifest]string) string {
	lines := make([]string, 0, len(sums))
	for m, sum := range sums {
		lines = append(lines, m.Tool+" "+sum+"\n")
	}
	sort.Strings(lines)
	h := sha256.New()
	for _, l := range lines {
		h.Write([]byte(l))
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// checksums computes every manifest's checksum.
func checksums(ms []*manifest.Manifest) (map[*manifest.Manifest]string, error) {
	sums := make(map[*manifest.Manifest]string, len(ms))
	for _, m := range ms {
		sum, err := manifest.Checksum(m)
		if err != nil {
			return nil, fmt.Errorf("manifest %s: %w", m.Tool, err)
		}
		sums[m] = sum
	}
	return sums, nil
}

// Reload re-reads the manifests with Options.Load and, when they changed, builds a new engine
// and swaps it in atomically: calls already deciding finish with the engine they loaded, and
// no call waits for the load (seed: Hot reload). A load or build that fails is refused, the
// previous manifests keep serving, and a reload_failed record with the reason is journaled; a
// change is journaled as a reloaded record with the new set checksum. Reloads are serialized.
func (g *Gateway) Reload(ctx context.Context) ReloadResult {
	if g.load == nil {
		return g.reloadFailed(errors.New("the gateway was started without a manifest source, so there is nothing to reload"))
	}
	ms, err := g.load(ctx)
	if err != nil {
		return g.reloadFailed(err)
	}
	sums, err := checksums(ms)
	if err != nil {
		return g.reloadFailed(err)
	}
	set := SetChecksum(sums)

	g.stateMu.Lock()
	defer g.stateMu.Unlock()
	if set == g.setChecksum {
		return ReloadResult{Tools: len(ms), Checksum: set}
	}
	e, err := g.newEngine(ms, (*g.tools.Load()).tools)
	if err != nil {
		return g.reloadFailed(err)
	}
	g.manifests, g.setChecksum = ms, set
	g.storeSums(sums)
	g.engine.Swap(e)
	note := fmt.Sprintf("%d manifests", len(ms))
	if _, err := g.store.AppendEvent(context.WithoutCancel(ctx), store.Event{Run: store.GatewayJournal, Kind: store.KindReloaded,
		ManifestChecksum: set, Note: note}); err != nil {
		g.warn("journal reload: %v", err)
	}
	g.warn("reloaded %s (%s)", note, set)
	return ReloadResult{Changed: true, Tools: len(ms), Checksum: set}
}

// reloadFailed journals and reports a refused reload.
func (g *Gateway) reloadFailed(err error) ReloadResult {
	g.warn("reload refused, the previous manifests keep serving: %v", err)
	if _, jerr := g.store.AppendEvent(context.Background(), store.Event{Run: store.GatewayJournal, Kind: store.KindReloadFailed,
		Note: err.Error()}); jerr != nil {
		g.warn("journal reload failure: %v", jerr)
	}
	g.stateMu.Lock()
	defer g.stateMu.Unlock()
	return ReloadResult{Tools: len(g.manifests), Checksum: g.setChecksum, Err: err}
}

// storeSums replaces the checksum cache with sums (the previous manifests are no longer served).
func (g *Gateway) storeSums(sums map[*manifest.Manifest]string) {
	m := &sync.Map{}
	for k, v := range sums {
		m.Store(k, v)
	}
	g.sums.Store(m)
}

// Watch polls paths every interval and reloads when their fingerprint changes, until ctx
// ends (seed: Hot reload, "File watch: on by default, polling every 2 s"). Files are compared
// by name, size, mode and modification time, following symbolic links, so that a ConfigMap
// volume's atomic `..data` swap is seen too. A path that cannot be read changes the
// fingerprint, so its reload fails and is journaled.
func (g *Gateway) Watch(ctx context.Context, interval time.Duration, paths ...string) {
	if interval <= 0 || len(paths) == 0 {
		return
	}
	last := Fingerprint(paths...)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fp := Fingerprint(paths...)
		if fp == last {
			continue
		}
		last = fp
		g.Reload(ctx)
	}
}

// Fingerprint summarises the files under paths (recursively, following links to a depth of
// maxLinkDepth) as a hex SHA-256 of each file's path, size, mode and modification time (ns).
// Errors are folded in, so a path that appears, vanishes or breaks changes the fingerprint.
func Fingerprint(paths ...string) string {
	h := sha256.New()
	for _, root := range paths {
		fingerprint(h, root, 0)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// maxLinkDepth bounds how many linked folders deep Fingerprint follows (a link cycle ends there).
const maxLinkDepth = 8

func fingerprint(h io.Writer, root string, depth int) {
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		fmt.Fprintf(h, "%s error %v\n", root, err)
		return
	}
	err = filepath.WalkDir(real, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			fmt.Fprintf(h, "%s error %v\n", p, err)
			return nil
		}
		fi, err := os.Stat(p) // follows links: ConfigMap volumes are links into ..data
		if err != nil {
			fmt.Fprintf(h, "%s error %v\n", p, err)
			return nil
		}
		if fi.IsDir() {
			if p != real && d.Type()&fs.ModeSymlink != 0 && depth < maxLinkDepth {
				// WalkDir does not enter a linked folder; its files still matter.
				fmt.Fprintf(h, "%s link\n", p)
				fingerprint(h, p, depth+1)
			}
			return nil
		}
		fmt.Fprintf(h, "%s %d %v %d\n", p, fi.Size(), fi.Mode(), fi.ModTime().UnixNano())
		return nil
	})
	if err != nil {
		fmt.Fprintf(h, "%s error %v\n", root, err)
	}
}
