package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/sideband"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/storage/filesystem"

	"github.com/go-git/go-billy/v5/osfs"
)

// firstHistoryDepth is the depth of the first history fetch; a second one goes to
// MaxCommits when the first does not reach what it looks for.
const firstHistoryDepth = 64

// objectCacheBytes bounds go-git's cache of decoded objects.
const objectCacheBytes = 8 * cache.MiByte

// fetcher fetches packs of one remote into one object store.
type fetcher struct {
	p     *prepared
	dir   string
	store *filesystem.Storage
	// first is the session opened to read the advertisement, until a pack request uses it.
	first *session
}

// session is one upload-pack exchange: the advertisement, then at most one request. Every
// byte read from the server goes through bound.
type session struct {
	s     transport.UploadPackSession
	adv   *packp.AdvRefs
	bound *answerBound
}

// openSession connects and reads the advertisement, bounded by MaxRefs (ErrTooLarge).
func openSession(ctx context.Context, p *prepared) (*session, error) {
	b := newAnswerBound(p)
	s, err := newUploadPackSession(p, b)
	if err != nil {
		return nil, err
	}
	adv, err := s.AdvertisedReferencesContext(withBound(ctx, b))
	if err != nil {
		_ = s.Close()
		if berr := b.failure(); berr != nil {
			return nil, berr
		}
		return nil, err
	}
	b.advertised()
	return &session{s: s, adv: adv, bound: b}, nil
}

// refs lists the advertised references like listRefs does (peeled tags as "name^{}").
func (s *session) refs() []*plumbing.Reference {
	var refs []*plumbing.Reference
	for name, h := range s.adv.References {
		refs = append(refs, plumbing.NewHashReference(plumbing.ReferenceName(name), h))
	}
	for name, h := range s.adv.Peeled {
		refs = append(refs, plumbing.NewHashReference(plumbing.ReferenceName(name+"^{}"), h))
	}
	return refs
}

func (s *session) close() {
	if s != nil {
		_ = s.s.Close()
	}
}

// newFetcher makes the object store in dir/.git and reads the remote's advertisement.
func newFetcher(ctx context.Context, p *prepared, dir string) (*fetcher, error) {
	st := filesystem.NewStorageWithOptions(osfs.New(filepath.Join(dir, ".git")),
		cache.NewObjectLRU(objectCacheBytes), filesystem.Options{})
	if err := st.Init(); err != nil {
		return nil, err
	}
	s, err := openSession(ctx, p)
	if err != nil {
		return nil, err
	}
	return &fetcher{p: p, dir: dir, store: st, first: s}, nil
}

func (f *fetcher) close() {
	f.first.close()
	f.first = nil
}

// session returns the unused first session, else a new one.
func (f *fetcher) session(ctx context.Context) (*session, error) {
	if s := f.first; s != nil {
		f.first = nil
		return s, nil
	}
	return openSession(ctx, f.p)
}

// packRequest is one upload-pack request.
type packRequest struct {
	what   string // what the pack is for, in messages: "content", "history", "tags"
	wants  []plumbing.Hash
	depth  int          // commits; 0 for the whole history
	filter packp.Filter // sent when the server supports filters
}

// packResult is what the server said besides the pack.
type packResult struct {
	shallows []plumbing.Hash
	filtered bool // the server advertised `filter` and the request carried it
}

// fetch sends r on a session, receives the pack into a file in f.dir, scans it against the
// limits and only then adds it to the store.
func (f *fetcher) fetch(ctx context.Context, r packRequest) (res packResult, err error) {
	s, err := f.session(ctx)
	if err != nil {
		return res, err
	}
	defer s.close()
	caps := s.adv.Capabilities
	req := packp.NewUploadPackRequestFromCapabilities(caps)
	req.Wants = slices.Clone(r.wants) // the encoder sorts them in place
	if r.depth > 0 {
		if !caps.Supports(capability.Shallow) {
			return res, errors.New("the server does not support shallow fetches (capability shallow)")
		}
		req.Depth = packp.DepthCommits(r.depth)
		if err := req.Capabilities.Set(capability.Shallow); err != nil {
			return res, err
		}
	}
	if r.filter != "" && caps.Supports(capability.Filter) {
		if err := req.Capabilities.Set(capability.Filter); err != nil {
			return res, err
		}
		req.Filter = r.filter
		res.filtered = true
	}
	if caps.Supports(capability.NoProgress) {
		if err := req.Capabilities.Set(capability.NoProgress); err != nil {
			return res, err
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := s.s.UploadPack(withBound(ctx, s.bound), req)
	if err != nil {
		if berr := s.bound.failure(); berr != nil {
			return res, berr
		}
		return res, err
	}
	defer func() {
		if err != nil {
			// Stop the server: a read after the cancellation fails, which kills a local
			// git-upload-pack (so that closing does not wait for it to finish writing).
			cancel()
			_, _ = io.Copy(io.Discard, resp)
		}
		_ = resp.Close()
	}()
	res.shallows = resp.Shallows
	var body io.Reader = resp
	switch {
	case req.Capabilities.Supports(capability.Sideband64k):
		body = sideband.NewDemuxer(sideband.Sideband64k, resp)
	case req.Capabilities.Supports(capability.Sideband):
		body = sideband.NewDemuxer(sideband.Sideband, resp)
	}

	file, err := os.CreateTemp(f.dir, "incoming-*.pack")
	if err != nil {
		return res, err
	}
	defer func() {
		_ = file.Close()
		_ = os.Remove(file.Name())
	}()
	limit := f.p.packLimit()
	n, err := io.Copy(file, io.LimitReader(body, limit+1))
	if err != nil {
		if berr := s.bound.failure(); berr != nil {
			return res, berr
		}
		return res, fmt.Errorf("receiving the %s pack: %w", r.what, err)
	}
	if n > limit {
		return res, f.tooLarge(r.what, res.filtered, "the server sent more than %s of compressed objects for the %s, more than the limit for %s of objects (--source-max-total-bytes)",
			size(limit), r.what, size(f.p.maxTotal))
	}
	if n == 0 {
		return res, fmt.Errorf("the server sent no pack for the %s", r.what)
	}
	if _, err := file.Seek(0, io.SeekStart); err != nil {
		return res, err
	}
	if err := f.scan(file, r.what, res.filtered); err != nil {
		return res, err
	}
	if _, err := file.Seek(0, io.SeekStart); err != nil {
		return res, err
	}
	w, err := f.store.PackfileWriter()
	if err != nil {
		return res, err
	}
	if _, err := io.Copy(w, file); err != nil {
		_ = w.Close()
		return res, fmt.Errorf("indexing the %s pack: %w", r.what, err)
	}
	if err := w.Close(); err != nil {
		return res, fmt.Errorf("indexing the %s pack: %w", r.what, err)
	}
	return res, nil
}

// scan reads every object header of the pack in r (and, for deltas, the delta's own header
// with the target size) and checks the limits: each object at most maxFile bytes inflated,
// their sum at most maxTotal, their count at most maxObj. Objects over the limit are never
// inflated; the others are inflated to io.Discard to check that they are as long as
// declared, and the pack's checksum is checked.
func (f *fetcher) scan(r io.Reader, what string, filtered bool) error {
	sc := packfile.NewScanner(r)
	_, count, err := sc.Header()
	if err != nil {
		return fmt.Errorf("reading the %s pack: %w", what, err)
	}
	if int64(count) > int64(f.p.maxObj) {
		return f.tooLarge(what, filtered, "the server sent %d objects for the %s, more than the limit of %d", count, what, f.p.maxObj)
	}
	var total int64
	for i := uint32(0); i < count; i++ {
		h, err := sc.NextObjectHeader()
		if err != nil {
			return fmt.Errorf("reading the %s pack: object %d: %w", what, i, err)
		}
		n := h.Length
		kind := h.Type.String()
		switch h.Type {
		case plumbing.CommitObject, plumbing.TreeObject, plumbing.BlobObject, plumbing.TagObject:
		case plumbing.OFSDeltaObject, plumbing.REFDeltaObject:
			// git stores a delta only when it is smaller than its target.
			if n > f.p.maxFile {
				return f.tooLarge(what, filtered, "the server sent a delta of %s, more than the %s limit for one object (--source-max-file-bytes)", size(n), size(f.p.maxFile))
			}
			var dh deltaHeader
			written, _, err := sc.NextObject(&dh)
			if err != nil || written != h.Length {
				return fmt.Errorf("reading the %s pack: delta at offset %d: %d of %d bytes: %v", what, h.Offset, written, h.Length, err)
			}
			if n, err = dh.targetSize(); err != nil {
				return fmt.Errorf("reading the %s pack: delta at offset %d: %w", what, h.Offset, err)
			}
			kind = "delta-compressed object"
		default:
			return fmt.Errorf("reading the %s pack: object at offset %d has the invalid type %d", what, h.Offset, h.Type)
		}
		if n > f.p.maxFile {
			return f.tooLarge(what, filtered, "the server sent a %s of %s, more than the %s limit for one file (--source-max-file-bytes)", kind, size(n), size(f.p.maxFile))
		}
		if total += n; total > f.p.maxTotal {
			return f.tooLarge(what, filtered, "the objects the server sent for the %s total more than the %s limit (--source-max-total-bytes)", what, size(f.p.maxTotal))
		}
	}
	if _, err := sc.Checksum(); err != nil {
		return fmt.Errorf("reading the %s pack: %w", what, err)
	}
	return nil
}

// tooLarge is the ErrTooLarge of a pack; the hint depends on whether the server filtered.
func (f *fetcher) tooLarge(what string, filtered bool, format string, args ...any) error {
	hint := "keep large files out of the repository, or raise the limit"
	switch {
	case !filtered && what == "history":
		hint = "the server does not support partial clone, so the history came with every file; enable uploadpack.allowFilter on the git server, or raise the limit"
	case !filtered:
		hint = "the server does not support partial clone, so it sent every file of the commit; enable uploadpack.allowFilter on the git server, or keep large files out of the repository"
	}
	return &Error{Op: "fetch", Subject: f.p.display, Kind: ErrTooLarge, Err: fmt.Errorf(format, args...), Hint: hint}
}

// deltaHeader keeps the first bytes of a delta: two little-endian base-128 varints, the
// source and the target size.
type deltaHeader struct {
	b [20]byte
	n int
}

func (d *deltaHeader) Write(p []byte) (int, error) {
	if d.n < len(d.b) {
		d.n += copy(d.b[d.n:], p)
	}
	return len(p), nil
}

func (d *deltaHeader) targetSize() (int64, error) {
	b := d.b[:d.n]
	var sizes [2]uint64
	for i := range sizes {
		var v uint64
		var shift uint
		for {
			if len(b) == 0 {
				return 0, errors.New("truncated delta header")
			}
			c := b[0]
			b = b[1:]
			v |= uint64(c&0x7f) << shift
			if c&0x80 == 0 {
				break
			}
			if shift += 7; shift > 56 {
				return 0, errors.New("delta size overflows")
			}
		}
		sizes[i] = v
	}
	if sizes[1] > 1<<62 {
		return 0, errors.New("delta size overflows")
	}
	return int64(sizes[1]), nil
}

// size formats n bytes for messages: "4 MiB", "300 KiB", "1234 bytes".
func size(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	default:
		return fmt.Sprintf("%d bytes", n)
	}
}

// commitIn returns the commit h of the store, or nil when it is absent.
func commitIn(st *filesystem.Storage, h plumbing.Hash) (*object.Commit, error) {
	c, err := object.GetCommit(st, h)
	if errors.Is(err, plumbing.ErrObjectNotFound) {
		return nil, nil
	}
	return c, err
}

func fetch(ctx context.Context, p *prepared, dir string) (a *Artifact, err error) {
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	f, err := newFetcher(ctx, p, dir)
	if err != nil {
		return nil, err
	}
	defer f.close()
	a = &Artifact{Dir: dir, URL: p.display, Since: p.since, store: f.store, path: p.path,
		maxFile: p.maxFile, maxTotal: p.maxTotal, maxFiles: p.maxFiles, maxWalk: p.maxObj}
	refs := f.first.refs()
	r, err := resolve(p, refs)
	if err != nil {
		return nil, err
	}
	if p.ref.SemVer != "" && p.verifiesTags() {
		var skipped skippedTags
		if r, skipped, err = f.chooseTag(ctx, indexRefs(refs)); err != nil {
			return nil, err
		}
		a.SkippedTags, a.SkippedTagsOmitted = skipped.list, skipped.omitted
	}

	var shallows []plumbing.Hash
	want := plumbing.NewHash(r.object) // what the content and history fetches ask for
	depth := 1
	if p.ref.Commit != "" {
		tip, dist, err := f.locateCommit(ctx, indexRefs(refs), a)
		if err != nil {
			return nil, err
		}
		want, depth = tip, dist+1
	}
	res, err := f.fetch(ctx, packRequest{what: "content", wants: []plumbing.Hash{want}, depth: depth,
		filter: packp.FilterBlobLimit(uint64(p.maxFile)+1, packp.BlobLimitPrefixNone)})
	if err != nil {
		return nil, err
	}
	if a.depth == 0 {
		shallows = res.shallows
	}
	c, err := commitIn(f.store, plumbing.NewHash(r.hash))
	if err != nil {
		return nil, err
	}
	if c == nil {
		return nil, fmt.Errorf("the server did not send the commit %s", r.hash)
	}
	if r.annotated() {
		a.tagObject = plumbing.NewHash(r.object)
	}
	a.Commit, a.Tag, a.Revision = r.hash, r.tag, r.revision()

	if p.since != "" && p.since != r.hash {
		// Deepen until the walk from the commit reaches Since (or the whole history) without
		// running out of fetched commits; a commit ref's history may already do.
		for _, depth := range append([]int{a.depth}, historyDepths(p.maxDepth)...) {
			if depth < a.depth {
				continue
			}
			if depth > a.depth {
				res, err := f.fetch(ctx, packRequest{what: "history", wants: []plumbing.Hash{want}, depth: depth,
					filter: packp.FilterTreeDepth(0)})
				if err != nil {
					return nil, err
				}
				a.depth, shallows = depth, res.shallows
			}
			w, err := walkRange(f.store, plumbing.NewHash(a.Commit), plumbing.NewHash(p.since), a.maxWalk)
			if err != nil {
				return nil, err
			}
			if w.complete {
				break
			}
		}
	}
	if len(shallows) > 0 {
		if err := f.store.SetShallow(shallows); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// historyDepths are the depths of the history fetches, shallowest first.
func historyDepths(max int) []int {
	if max <= firstHistoryDepth {
		return []int{max}
	}
	return []int{firstHistoryDepth, max}
}

// locateCommit fetches the commit history (no trees) of the ref's branch, or of every
// branch and tag, and returns the advertised tip the commit is nearest to and its distance
// from it in commits. It fails with ErrRefNotFound when the commit is not in the history,
// or not within MaxCommits of a tip.
func (f *fetcher) locateCommit(ctx context.Context, byName advertised, a *Artifact) (plumbing.Hash, int, error) {
	p := f.p
	type tip struct{ object, commit plumbing.Hash }
	var tips []tip
	if p.ref.Branch != "" {
		h := plumbing.NewHash(byName[plumbing.NewBranchReferenceName(p.ref.Branch).String()])
		tips = append(tips, tip{h, h})
	} else {
		seen := map[plumbing.Hash]bool{}
		for name, h := range byName {
			if name == "HEAD" {
				continue
			}
			var t tip
			if tag, ok := strings.CutPrefix(name, "refs/tags/"); ok {
				if strings.HasSuffix(tag, "^{}") {
					continue
				}
				c, obj := byName.tag(tag)
				t = tip{plumbing.NewHash(obj), plumbing.NewHash(c)}
			} else if _, ok := strings.CutPrefix(name, "refs/heads/"); ok {
				t = tip{plumbing.NewHash(h), plumbing.NewHash(h)}
			} else {
				continue
			}
			if !seen[t.object] {
				seen[t.object] = true
				tips = append(tips, t)
			}
		}
	}
	where := "any branch or tag"
	if p.ref.Branch != "" {
		where = "branch " + p.ref.Branch
	}
	if len(tips) == 0 {
		return plumbing.ZeroHash, 0, notFound(p, "commit %s not found: the remote has no branch or tag", p.ref.Commit)
	}
	wants := make([]plumbing.Hash, len(tips))
	commits := make([]plumbing.Hash, len(tips))
	for i, t := range tips {
		wants[i], commits[i] = t.object, t.commit
	}
	target := plumbing.NewHash(p.ref.Commit)
	for _, depth := range historyDepths(p.maxDepth) {
		if _, err := f.fetch(ctx, packRequest{what: "history", wants: wants, depth: depth, filter: packp.FilterTreeDepth(0)}); err != nil {
			return plumbing.ZeroHash, 0, err
		}
		a.depth = depth
		i, dist, complete, err := nearest(f.store, commits, target, a.maxWalk)
		if err != nil {
			return plumbing.ZeroHash, 0, err
		}
		if i >= 0 {
			return wants[i], dist, nil
		}
		if complete {
			return plumbing.ZeroHash, 0, &Error{Op: "fetch", Subject: p.display, Kind: ErrRefNotFound,
				Err: fmt.Errorf("commit %s not found on %s", p.ref.Commit, where), Hint: "check the commit in the spec"}
		}
	}
	return plumbing.ZeroHash, 0, &Error{Op: "fetch", Subject: p.display, Kind: ErrRefNotFound,
		Err:  fmt.Errorf("commit %s is not among the %d most recent commits of %s", p.ref.Commit, p.maxDepth, where),
		Hint: "pin a newer commit, or use a branch or tag"}
}
