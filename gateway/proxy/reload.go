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
	"strings"
	"sync"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/bundle"
	"github.com/reversi-gitops/reversi/pkg/policy"
)

// Loaded is what a LoadFunc read: the manifests; one high-water mark per signed snapshot they
// came from, which the gateway advances in its store before it serves them (an older snapshot
// than one it served is refused, also after a restart; TUF: rollback attacks); and the
// revision those snapshots name (only signed data is shown).
type Loaded struct {
	Manifests []*manifest.Manifest
	// Policy is the compiled policy set served with them (nil: none).
	Policy   *policy.Set
	Marks    []store.HighWater
	Revision string
}

// LoadFunc re-reads the manifests and the policy (and with them the trusted manifest keys) for
// a reload. It returns every problem at once; any error refuses the reload, so a broken policy
// keeps the previous one serving like a broken manifest.
type LoadFunc func(ctx context.Context) (Loaded, error)

// ReloadResult is what one reload did (seed: `reversi.reload` returns {changed, tools,
// policy_checksum, error?}). Checksum is the digest of the manifests now served,
// PolicyChecksum the policy set's (policy.Set.Checksum; "" without a policy).
type ReloadResult struct {
	Changed        bool
	Tools          int    // manifests now served
	Checksum       string // "sha256:<hex>"
	PolicyChecksum string
	Err            error // the load failed: the previous manifests and policy keep serving
}

// digest returns the digest of a manifest set, the same as a registry bundle's
// (pkg/bundle: `sha256:<hex>` over the sorted tool@version:checksum lines, so it does not
// depend on file order or layout, and a gateway fed from a ConfigMap reports the digest the
// controller rendered), and every manifest's checksum.
func digest(ms []*manifest.Manifest) (string, map[*manifest.Manifest]string, error) {
	b, err := bundle.FromManifests("", ms)
	if err != nil {
		return "", nil, err
	}
	byTool := make(map[string]string, len(b.Entries))
	for _, e := range b.Entries {
		byTool[e.Tool] = e.Checksum
	}
	sums := make(map[*manifest.Manifest]string, len(ms))
	for _, m := range ms {
		sums[m] = byTool[m.Tool]
	}
	return b.Digest(), sums, nil
}

// Digest is the digest of the manifests served (see digest), as the last reload or the start
// left them.
func (g *Gateway) Digest() string {
	g.stateMu.Lock()
	defer g.stateMu.Unlock()
	return g.setChecksum
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
	l, err := g.load(ctx)
	if err != nil {
		return g.reloadFailed(err)
	}
	if err := g.store.AdvanceHighWater(context.WithoutCancel(ctx), l.Marks); err != nil {
		return g.reloadFailed(err)
	}
	g.metrics.setRevision(l.Revision)
	ms := l.Manifests
	set, sums, err := digest(ms)
	if err != nil {
		return g.reloadFailed(err)
	}

	g.stateMu.Lock()
	defer g.stateMu.Unlock()
	if set == g.setChecksum && l.Policy.Checksum() == g.policy.Checksum() {
		g.warn("reload: no change (%d manifests, %s)", len(ms), set)
		return ReloadResult{Tools: len(ms), Checksum: set, PolicyChecksum: g.policy.Checksum()}
	}
	oldPolicy := g.policy
	g.policy = l.Policy // newEngine reads it
	e, err := g.newEngine(ms, (*g.tools.Load()).tools)
	if err != nil {
		g.policy = oldPolicy
		return g.reloadFailedLocked(err) // stateMu is held: reloadFailed would wait for itself
	}
	g.manifests, g.setChecksum = ms, set
	g.storeSums(sums)
	g.engine.Swap(e)
	note := fmt.Sprintf("%d manifests", len(ms))
	switch n := l.Policy.Len(); {
	case n > 0:
		note += fmt.Sprintf(", policy %s (%d rules)", l.Policy.Checksum(), n)
	case oldPolicy.Len() > 0: // said out loud: every rule stopped applying
		note += fmt.Sprintf(", policy removed (was %s, %d rules): no policy rule applies any more", oldPolicy.Checksum(), oldPolicy.Len())
	}
	if _, err := g.store.AppendEvent(context.WithoutCancel(ctx), store.Event{Run: store.GatewayJournal, Kind: store.KindReloaded,
		ManifestChecksum: set, Note: note}); err != nil {
		g.warn("journal reload: %v", err)
	}
	g.metrics.reloaded(true)
	g.warn("reloaded %s (%s)", note, set)
	g.warnUnmatched(e)
	return ReloadResult{Changed: true, Tools: len(ms), Checksum: set, PolicyChecksum: l.Policy.Checksum()}
}

// reloadFailed journals and reports a refused reload.
func (g *Gateway) reloadFailed(err error) ReloadResult {
	g.stateMu.Lock()
	defer g.stateMu.Unlock()
	return g.reloadFailedLocked(err)
}

// reloadFailedLocked is reloadFailed with stateMu held.
func (g *Gateway) reloadFailedLocked(err error) ReloadResult {
	g.warn("reload refused, the previous manifests keep serving (and the previous policy): %v", err)
	// The record and its alert.reload_refused notifications commit together (issue 24).
	if _, jerr := g.store.AppendEvent(context.Background(), store.Event{Run: store.GatewayJournal, Kind: store.KindReloadFailed,
		Note: err.Error(), Alert: g.reloadRefusedAlert(err, g.setChecksum)}); jerr != nil {
		g.warn("journal reload failure: %v", jerr)
	}
	g.metrics.reloaded(false)
	return ReloadResult{Tools: len(g.manifests), Checksum: g.setChecksum, PolicyChecksum: g.policy.Checksum(), Err: err}
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

// warnUnmatched says on stderr which manifests no upstream tool matches: they enforce nothing.
func (g *Gateway) warnUnmatched(e *engine.Engine) {
	if u := e.Unmatched(); len(u) > 0 {
		g.warn("%d manifests name no upstream tool, so they enforce nothing: %s (tools are exposed as <upstream>.<tool> unless the upstream sets namespace: false)",
			len(u), strings.Join(u, ", "))
	}
}
