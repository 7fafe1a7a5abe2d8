package source

import (
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/filesystem"
)

// span is the result of walkRange.
type span struct {
	// commits are reachable from head but not from since, head first (breadth first).
	commits []*object.Commit
	// descends: since is head or one of its ancestors.
	descends bool
	// complete: every commit of the span has its parents in the store (or is a root), so
	// commits and descends are exact; false when the fetched history ends inside the span
	// or the walk hit its bound.
	complete bool
}

// ancestors returns since and the ancestors of since present in st, at most max of them.
func ancestors(st *filesystem.Storage, since plumbing.Hash, max int) (map[plumbing.Hash]bool, error) {
	seen := map[plumbing.Hash]bool{}
	queue := []plumbing.Hash{since}
	for len(queue) > 0 && len(seen) < max {
		h := queue[0]
		queue = queue[1:]
		if seen[h] {
			continue
		}
		c, err := commitIn(st, h)
		if err != nil {
			return nil, err
		}
		if c == nil {
			continue
		}
		seen[h] = true
		queue = append(queue, c.ParentHashes...)
	}
	return seen, nil
}

// walkRange walks the commits of st from head, stopping at since and its ancestors (as far
// as st holds them), at most max commits.
func walkRange(st *filesystem.Storage, head, since plumbing.Hash, max int) (span, error) {
	below, err := ancestors(st, since, max)
	if err != nil {
		return span{}, err
	}
	w := span{complete: true}
	seen := map[plumbing.Hash]bool{}
	queue := []plumbing.Hash{head}
	for len(queue) > 0 {
		h := queue[0]
		queue = queue[1:]
		if seen[h] {
			continue
		}
		seen[h] = true
		if h == since {
			w.descends = true
			continue
		}
		if below[h] {
			continue // an ancestor of since: since is not behind it
		}
		c, err := commitIn(st, h)
		if err != nil {
			return span{}, err
		}
		if c == nil || len(w.commits) >= max {
			w.complete = false
			continue
		}
		w.commits = append(w.commits, c)
		queue = append(queue, c.ParentHashes...)
	}
	return w, nil
}

// nearest returns the index of the tip in tips that target is nearest to (breadth first
// over the commits of st), its distance in commits, or -1, and whether the walk saw the
// whole history of the tips (no commit with a missing parent).
func nearest(st *filesystem.Storage, tips []plumbing.Hash, target plumbing.Hash, max int) (int, int, bool, error) {
	type node struct {
		h         plumbing.Hash
		tip, dist int
	}
	seen := map[plumbing.Hash]bool{}
	var queue []node
	for i, t := range tips {
		queue = append(queue, node{t, i, 0})
	}
	complete := true
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		if seen[n.h] {
			continue
		}
		seen[n.h] = true
		if n.h == target {
			return n.tip, n.dist, complete, nil
		}
		c, err := commitIn(st, n.h)
		if err != nil {
			return -1, 0, false, err
		}
		if c == nil || len(seen) > max {
			complete = false
			continue
		}
		for _, ph := range c.ParentHashes {
			queue = append(queue, node{ph, n.tip, n.dist + 1})
		}
	}
	return -1, 0, complete, nil
}

// Descends reports whether the fetched commit is commit or descends from it (commit is one
// of its ancestors), by a walk over the commit history Fetch fetched: the history back to
// Options.Since, at most Options.MaxCommits deep. It answers false only when the walk saw
// every ancestor of the fetched commit that is not an ancestor of commit; when the fetched
// history ends first (commit is older than MaxCommits, or was not Options.Since, so no
// history was fetched for it) it fails closed with ErrTooLarge. commit must be 40 hex
// (ErrInvalidOptions otherwise).
func (a *Artifact) Descends(commit string) (bool, error) {
	commit = strings.ToLower(commit)
	if _, err := hex.DecodeString(commit); err != nil || len(commit) != 40 {
		return false, optionsError("commit %q is not a full 40-character SHA-1", commit)
	}
	if a == nil || a.store == nil {
		return false, &Error{Op: "ancestry", Kind: ErrInvalidOptions, Err: fmt.Errorf("the artifact has no repository (cleaned up, or not made by Fetch)")}
	}
	if commit == a.Commit {
		return true, nil
	}
	w, err := walkRange(a.store, plumbing.NewHash(a.Commit), plumbing.NewHash(commit), a.maxWalk)
	if err != nil {
		return false, &Error{Op: "ancestry", Subject: a.Revision, Kind: ErrFetchFailed, Err: err}
	}
	if w.descends {
		return true, nil
	}
	if !w.complete {
		e := a.historyTooShort("ancestry", commit)
		e.Err = fmt.Errorf("cannot tell whether %s descends from %s: %w", short(a.Commit), short(commit), e.Err)
		return false, e
	}
	return false, nil
}

// historyTooShort is the error of a walk that ran out of fetched history before reaching
// commit: ErrTooLarge (the bound was hit).
func (a *Artifact) historyTooShort(op, commit string) *Error {
	if a.depth == 0 {
		return &Error{Op: op, Subject: a.Revision, Kind: ErrTooLarge,
			Err:  fmt.Errorf("the history of %s was not fetched, so it cannot be compared with %s", short(a.Commit), short(commit)),
			Hint: "set Options.Since to the commit to compare with"}
	}
	return &Error{Op: op, Subject: a.Revision, Kind: ErrTooLarge,
		Err: fmt.Errorf("the history fetched from %s (%d commits deep, the limit) does not reach %s",
			short(a.Commit), a.depth, short(commit)),
		Hint: "the last applied commit is older than the history limit, or the branch was rewritten"}
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// subject is the first line of a commit message.
func subject(c *object.Commit) string {
	s, _, _ := strings.Cut(strings.TrimSpace(c.Message), "\n")
	return strings.TrimSpace(s)
}

// oldestFirst orders the commits of a span so that every commit comes after its parents
// within the span (a topological order; parents in their order in the commit).
func oldestFirst(commits []*object.Commit) []*object.Commit {
	in := make(map[plumbing.Hash]*object.Commit, len(commits))
	for _, c := range commits {
		in[c.Hash] = c
	}
	out := make([]*object.Commit, 0, len(commits))
	done := map[plumbing.Hash]bool{}
	type frame struct {
		c    *object.Commit
		next int
	}
	for _, root := range commits {
		if done[root.Hash] {
			continue
		}
		stack := []frame{{c: root}}
		done[root.Hash] = true
		for len(stack) > 0 {
			top := &stack[len(stack)-1]
			if top.next < len(top.c.ParentHashes) {
				ph := top.c.ParentHashes[top.next]
				top.next++
				if p, ok := in[ph]; ok && !done[ph] {
					done[ph] = true
					stack = append(stack, frame{c: p})
				}
				continue
			}
			out = append(out, top.c)
			stack = stack[:len(stack)-1]
		}
	}
	return out
}
