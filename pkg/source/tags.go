package source

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
)

// The batches in which chooseTag fetches the tag objects of the semver candidates: the
// first holds the firstTagBatch highest annotated candidates, each next one tagBatchGrowth
// times as many (16, 64, 256, 1024, then the rest up to MaxTagCandidates: five requests
// for all of them). A batch whose pack breaks a limit is fetched again in halves.
const (
	firstTagBatch  = 16
	tagBatchGrowth = 4
)

// Bounds of what a SkippedTag and an error message quote of a tag: its name (a semver tag
// may carry a pre-release of any length) and the reason it was skipped (which may quote
// the name inside the tag object).
const (
	maxQuotedTagName = 256
	maxQuotedReason  = 512
)

// skippedTags collects the tags a semver choice skipped, highest first: the first
// MaxSkippedTags of them, then only their number.
type skippedTags struct {
	list    []SkippedTag
	omitted int
}

func (s *skippedTags) add(tag, reason string) {
	if len(s.list) >= MaxSkippedTags {
		s.omitted++
		return
	}
	s.list = append(s.list, SkippedTag{Tag: clip(tag, maxQuotedTagName), Reason: clip(reason, maxQuotedReason)})
}

// summary lists the skipped tags with their reasons, for an error message.
func (s *skippedTags) summary() string {
	why := make([]string, len(s.list))
	for i, t := range s.list {
		why[i] = t.Tag + ": " + t.Reason
	}
	msg := strings.Join(why, "; ")
	if s.omitted > 0 {
		msg += fmt.Sprintf("; and %d more tags", s.omitted)
	}
	return msg
}

// clip shortens s to at most n bytes (on a rune boundary), marking the cut with "…".
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// packTooLarge says whether err is a pack (or the answer carrying it) that broke a limit of
// Options, as opposed to any other failure, an advertisement over MaxRefs included.
func packTooLarge(err error) bool {
	var se *Error
	return errors.As(err, &se) && se.Kind == ErrTooLarge && se.Op == "fetch"
}

// chooseTag returns the highest tag in the semver range whose signatures verify with
// p.verify (the tag object's, named as the ref; with TagAndHEAD its commit's too), and the
// higher ones it skipped, whatever their number:
//
//   - Lightweight tags carry no signature: they are skipped without a fetch and count
//     against no bound but MaxRefs.
//   - The tag objects of the annotated candidates, with their commits (depth 1, filter
//     tree:0: no trees), are fetched highest first in batches of 16, 64, 256, 1024 and the
//     rest, each batch one upload-pack request bounded like every pack (MaxTotalBytes,
//     MaxObjects, MaxFileBytes, the compressed size), stopping at the first tag that
//     verifies. A batch whose pack breaks one of those limits is fetched again in halves;
//     a single tag whose objects break it is skipped (it cannot be verified within the
//     limits). Tag objects already fetched are not asked for again.
//   - At most MaxTagCandidates annotated candidates are tried and at most MaxTagRequests
//     requests made; past either, ErrTooLarge names the limit and the skipped tags.
//
// When every candidate fails, the error is ErrVerification, naming the first
// MaxSkippedTags skipped tags and why, and how many more there are.
func (f *fetcher) chooseTag(ctx context.Context, byName advertised) (resolved, skippedTags, error) {
	p := f.p
	names := matchingTags(p.semver, byName.tags())
	cands := make([]resolved, len(names))
	annotated := 0
	for i, t := range names {
		c, obj := byName.tag(t)
		cands[i] = resolved{name: t, tag: t, hash: c, object: obj}
		if cands[i].annotated() {
			annotated++
		}
	}
	has := func(h plumbing.Hash) bool { return f.store.HasEncodedObject(h) == nil }

	var sk skippedTags
	tried, requests := 0, 0 // annotated candidates tried; tag pack requests made
	batch := firstTagBatch
	for i := 0; i < len(cands); {
		// The window [i, j): the next n annotated candidates and the lightweight ones
		// among and before them.
		n := min(batch, MaxTagCandidates-tried)
		j, inWindow := i, 0
		var wants []plumbing.Hash
		asked := map[plumbing.Hash]bool{}
		for ; j < len(cands); j++ {
			if !cands[j].annotated() {
				continue
			}
			if inWindow == n {
				break
			}
			inWindow++
			if h := plumbing.NewHash(cands[j].object); !asked[h] && !has(h) {
				asked[h] = true
				wants = append(wants, h)
			}
		}
		var fetchErr error
		if len(wants) > 0 {
			if requests == MaxTagRequests {
				return resolved{}, sk, &Error{Op: "verify", Subject: p.display, Kind: ErrTooLarge,
					Err: fmt.Errorf("the tag objects of the tags matching semver %q took more than %d fetch requests (MaxTagRequests), their packs breaking the limits again and again; %d of %d annotated tags tried, none verifies: %s",
						p.ref.SemVer, MaxTagRequests, tried, annotated, sk.summary()),
					Hint: "delete the oversized tags above the release on the remote, or raise --source-max-total-bytes and --source-max-file-bytes"}
			}
			requests++
			_, err := f.fetch(ctx, packRequest{what: "tags", wants: wants, depth: 1, filter: packp.FilterTreeDepth(0)})
			switch {
			case err == nil:
				batch = min(batch*tagBatchGrowth, MaxTagCandidates)
			case packTooLarge(err) && len(wants) > 1:
				batch = max(inWindow/2, 1)
				continue // the same window, halved
			case packTooLarge(err):
				fetchErr = err // the one tag object asked for (or its commit) breaks a limit
			default:
				return resolved{}, sk, err
			}
		}
		for _, r := range cands[i:j] {
			var err error
			if r.annotated() {
				tried++
				if fetchErr != nil && !has(plumbing.NewHash(r.object)) {
					err = fmt.Errorf("its tag object and commit cannot be fetched within the limits: %s", reasonOf(fetchErr))
				}
			}
			if err == nil {
				if err = verifyTagRef(f.store, r, p.verify); err == nil {
					return r, sk, nil
				}
			}
			sk.add(r.tag, reasonOf(err))
		}
		if i = j; i < len(cands) && tried >= MaxTagCandidates {
			// cands[i] is an annotated candidate past the bound.
			return resolved{}, sk, &Error{Op: "verify", Subject: p.display, Kind: ErrTooLarge,
				Err: fmt.Errorf("none of the %d highest annotated tags matching semver %q verifies (mode %s), and %d lower annotated tag(s) are not tried (the limit MaxTagCandidates): %s",
					MaxTagCandidates, p.ref.SemVer, p.verify.Mode, annotated-tried, sk.summary()),
				Hint: "delete the tags above the release that are not signed by a trusted key, or sign a newer release tag with a trusted key"}
		}
	}
	return resolved{}, sk, &Error{Op: "verify", Subject: p.display, Kind: ErrVerification,
		Err:  fmt.Errorf("no tag matching semver %q verifies (mode %s): %s", p.ref.SemVer, p.verify.Mode, sk.summary()),
		Hint: "sign a release tag with a trusted key"}
}

// reasonOf is an error's cause without the operation and subject, for SkippedTag.Reason.
func reasonOf(err error) string {
	var se *Error
	if errors.As(err, &se) && se.Err != nil {
		return se.Err.Error()
	}
	return err.Error()
}

// chooseRemoteTag is RemoteRevision for a semver ref with tag verification: chooseTag
// fetches the candidates' tag objects into dir, which is removed.
func chooseRemoteTag(ctx context.Context, p *prepared, dir string) (string, error) {
	defer os.RemoveAll(dir)
	f, err := newFetcher(ctx, p, dir)
	if err != nil {
		return "", err
	}
	defer f.close()
	r, _, err := f.chooseTag(ctx, indexRefs(f.first.refs()))
	if err != nil {
		return "", err
	}
	return r.revision(), nil
}
