package registry

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/gofrs/flock"
	"github.com/google/renameio/v2"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// WriteOptions are what every writing command takes: who (--by), the signing key (--key, may
// be nil for an unsigned version) and a note (--note).
type WriteOptions struct {
	By     string
	Note   string
	Signer *signing.Signer
	// Now returns the version's time; time.Now when nil.
	Now func() time.Time
}

func (o WriteOptions) now() time.Time {
	if o.Now != nil {
		return o.Now().UTC().Truncate(time.Second)
	}
	return time.Now().UTC().Truncate(time.Second)
}

// lockFile serialises writers of one registry across processes.
const lockFile = ".lock"

// update runs fn on the current index under the registry's exclusive lock; fn writes version
// files with writeVersion and the index is then replaced atomically. Version files are written
// before the index that lists them, so a reader never sees a listed version without its file.
func (r *Registry) update(o WriteOptions, fn func(idx *Index) error) error {
	if r.fsys != nil {
		return errors.New("this registry is read-only (opened with NewFS)")
	}
	if err := os.MkdirAll(r.Dir, 0o755); err != nil {
		return err
	}
	lock := flock.New(filepath.Join(r.Dir, lockFile))
	if err := lock.Lock(); err != nil {
		return fmt.Errorf("locking %s: %w", r.Dir, err)
	}
	defer lock.Unlock()
	idx, err := r.readIndex(true)
	if err != nil {
		return err
	}
	if err := fn(idx); err != nil {
		return err
	}
	idx.Sequence++ // every write, so an older signed index can never pass for the newest
	if err := idx.sign(o.Signer); err != nil {
		return err
	}
	data, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return err
	}
	return renameio.WriteFile(filepath.Join(r.Dir, IndexFile), append(data, '\n'), 0o644)
}

// appendVersion stamps m as the tool's next version with status, signs it, writes its file
// (never overwriting one) and lists it in idx.
func (r *Registry) appendVersion(idx *Index, m *manifest.Manifest, status manifest.Status, author, approver string, o WriteOptions) (Entry, error) {
	next := *m
	next.Version = len(idx.Tools[m.Tool]) + 1
	next.Status = status
	if status != manifest.Deprecated {
		next.ReplacedBy = ""
	}
	canonical, err := manifest.CanonicalJSON(&next)
	if err != nil {
		return Entry{}, err
	}
	sum, err := manifest.Checksum(&next)
	if err != nil {
		return Entry{}, err
	}
	e := Entry{Version: next.Version, Status: status, Checksum: sum, Author: author, Approver: approver, Time: o.now(), Note: o.Note}
	if o.Signer != nil {
		sig, err := o.Signer.Sign(signing.Message(m.Tool, e.Version, sum))
		if err != nil {
			return Entry{}, err
		}
		e.KeyID, e.Signature = o.Signer.KeyID, base64.StdEncoding.EncodeToString(sig)
	}
	rel, err := versionPath(m.Tool, e.Version)
	if err != nil {
		return Entry{}, err
	}
	full := filepath.Join(r.Dir, filepath.FromSlash(rel))
	if _, err := os.Lstat(full); err == nil {
		return Entry{}, fmt.Errorf("%s exists but index.json does not list it: versions are immutable; run reversi manifests verify", rel)
	}
	// No HTML escaping: the embedded manifest must compact back to its canonical bytes.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(VersionFile{Tool: m.Tool, Entry: e, Manifest: canonical}); err != nil {
		return Entry{}, err
	}
	data := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		return Entry{}, err
	}
	if err := renameio.WriteFile(full, append(data, '\n'), 0o644); err != nil {
		return Entry{}, err
	}
	idx.Tools[m.Tool] = append(idx.Tools[m.Tool], e)
	return e, nil
}

// Published is one version written by a writer.
type Published struct {
	Tool string
	Entry
	// Warnings are rules the registry breaks after this write that do not stop it (an
	// enforced tool naming one that is only a draft: the registry does not load until that
	// tool is approved too).
	Warnings []string
}

// Publish adds every manifest as a new version of its tool with status (draft by default;
// the flag overrides a `status:` in the file). The manifests must be valid on their own and
// together with the registry's newest versions of the other tools (cross-manifest rules).
func (r *Registry) Publish(ms []*manifest.Manifest, status manifest.Status, o WriteOptions) ([]Published, error) {
	if status == "" {
		status = manifest.Draft
	}
	if status != manifest.Draft && status != manifest.Approved {
		return nil, fmt.Errorf("publish --status must be draft or approved, not %s", status)
	}
	var out []Published
	err := r.update(o, func(idx *Index) error {
		warnings, err := r.checkSet(idx, ms, status)
		if err != nil {
			return err
		}
		approver := ""
		if status == manifest.Approved {
			approver = o.By
		}
		for _, m := range ms {
			e, err := r.appendVersion(idx, m, status, o.By, approver, o)
			if err != nil {
				return err
			}
			out = append(out, Published{Tool: m.Tool, Entry: e, Warnings: warnings})
			warnings = nil
		}
		return nil
	})
	return out, err
}

// checkSet applies the cross-manifest rules to the registry as Load will see it once ms are
// written as new versions with status: for every other tool the version Load picks (the
// newest non-draft one, else the newest draft), for the tools of ms their new versions. So a
// writer refuses to create an enforced version that names a tool which is only a draft, as
// Load would refuse it. A new draft of a tool that keeps an enforced version does not stand in
// for it in the others' references; its own references are checked against the rest.
// Problems other tools have already are not this write's: they do not block it (approving
// the drafts an old registry's approved tool leans on is how it is repaired).
func (r *Registry) checkSet(idx *Index, ms []*manifest.Manifest, status manifest.Status) ([]string, error) {
	fsys, closeFS, err := r.files()
	if err != nil {
		return nil, err
	}
	defer closeFS()
	tools := idx.tools()
	current := map[string]*manifest.Manifest{} // what Load reads now
	for _, tool := range tools {
		if es := idx.Tools[tool]; len(es) > 0 {
			v, err := r.readVersion(fsys, tool, loadedEntry(es), nil, false)
			if err != nil {
				return nil, err
			}
			current[tool] = v.Manifest
		}
	}
	// keeps: the tool's enforced version stays the one Load reads under a new draft.
	keeps := func(tool string) bool {
		c := current[tool]
		return status == manifest.Draft && c != nil && c.Status != manifest.Draft
	}
	incoming := map[string]bool{}
	var fresh, shadowed []*manifest.Manifest
	for _, m := range ms {
		next := *m // as appendVersion stamps it
		next.Status = status
		if status != manifest.Deprecated {
			next.ReplacedBy = ""
		}
		incoming[m.Tool] = true
		if keeps(m.Tool) {
			shadowed = append(shadowed, &next)
		} else {
			fresh = append(fresh, &next)
		}
	}
	var others, kept, now []*manifest.Manifest
	for _, tool := range tools {
		c := current[tool]
		switch {
		case c == nil:
			continue
		case !incoming[tool]:
			others = append(others, c)
		case keeps(tool):
			kept = append(kept, c)
		}
		now = append(now, c)
	}
	var errs []error
	var before map[string]bool
	for _, e := range manifest.ValidateSet(slices.Concat(fresh, kept, others)) {
		if fe, ok := e.(*manifest.FieldError); ok && !incoming[fe.Tool] {
			if before == nil {
				before = map[string]bool{}
				for _, b := range manifest.ValidateSet(now) {
					before[b.Error()] = true
				}
			}
			if before[e.Error()] {
				continue
			}
		}
		errs = append(errs, e)
	}
	if len(shadowed) > 0 {
		for _, e := range manifest.ValidateSet(slices.Concat(shadowed, fresh, others)) {
			if fe, ok := e.(*manifest.FieldError); ok && keeps(fe.Tool) && incoming[fe.Tool] {
				errs = append(errs, e)
			}
		}
	}
	var warnings []string
	var fatal []error
	for _, e := range errs {
		if errors.Is(e, manifest.ErrDraftReference) {
			warnings = append(warnings, e.Error()+": the registry does not load until then")
		} else {
			fatal = append(fatal, e)
		}
	}
	return warnings, errors.Join(fatal...)
}

// loadedEntry is the version of a tool that Load reads: the newest non-draft one, else the
// newest draft (which stands for a tool that has only drafts).
func loadedEntry(es []Entry) Entry {
	for i := len(es) - 1; i >= 0; i-- {
		if es[i].Status != manifest.Draft {
			return es[i]
		}
	}
	return es[len(es)-1]
}

// latest reads a tool's version: the given one (version > 0) or the newest whose status is
// one of statuses.
func (r *Registry) latest(idx *Index, tool string, version int, statuses ...manifest.Status) (*Version, error) {
	es, ok := idx.Tools[tool]
	if !ok {
		return nil, fmt.Errorf("%s is not in the registry %s: publish it first", tool, r.Dir)
	}
	var pick *Entry
	for i := len(es) - 1; i >= 0; i-- {
		if version > 0 && es[i].Version != version {
			continue
		}
		for _, s := range statuses {
			if es[i].Status == s {
				pick = &es[i]
			}
		}
		if version > 0 && pick == nil {
			return nil, fmt.Errorf("%s v%d is %s, not %v", tool, version, es[i].Status, statuses)
		}
		if pick != nil {
			break
		}
	}
	if pick == nil {
		if version > 0 {
			return nil, fmt.Errorf("%s has no v%d (newest is v%d)", tool, version, len(es))
		}
		return nil, fmt.Errorf("%s has no %v version", tool, statuses)
	}
	fsys, closeFS, err := r.files()
	if err != nil {
		return nil, err
	}
	defer closeFS()
	return r.readVersion(fsys, tool, *pick, nil, false)
}

// Approve promotes a draft (the newest version when it is a draft, or version) to a new
// approved version by o.By. With
// fourEyes the draft's author may not approve it. The manifest, approval rules included, is
// kept exactly as published.
func (r *Registry) Approve(tool string, version int, fourEyes bool, o WriteOptions) (Published, error) {
	var out Published
	err := r.update(o, func(idx *Index) error {
		// Without --version only a draft that is the newest version is pending; an older
		// draft was superseded and is approved only when named.
		if es := idx.Tools[tool]; version == 0 && len(es) > 0 && es[len(es)-1].Status != manifest.Draft {
			return fmt.Errorf("%s has no pending draft: the newest version, v%d, is %s; name an older draft with --version", tool, len(es), es[len(es)-1].Status)
		}
		v, err := r.latest(idx, tool, version, manifest.Draft)
		if err != nil {
			return err
		}
		if fourEyes && v.Author == o.By {
			return fmt.Errorf("four eyes: %s wrote %s v%d and cannot approve it; ask another reviewer", o.By, tool, v.Version)
		}
		warnings, err := r.checkSet(idx, []*manifest.Manifest{v.Manifest}, manifest.Approved)
		if err != nil {
			return err
		}
		if o.Note == "" {
			o.Note = fmt.Sprintf("approved from v%d", v.Version)
		}
		e, err := r.appendVersion(idx, v.Manifest, manifest.Approved, v.Author, o.By, o)
		out = Published{Tool: tool, Entry: e, Warnings: warnings}
		return err
	})
	return out, err
}

// Deprecate publishes the newest approved version again as deprecated, naming replacedBy
// (which must be in the registry with a non-draft version) when given.
func (r *Registry) Deprecate(tool, replacedBy string, o WriteOptions) (Published, error) {
	var out Published
	err := r.update(o, func(idx *Index) error {
		v, err := r.latest(idx, tool, 0, manifest.Approved)
		if err != nil {
			return fmt.Errorf("deprecate needs an approved version: %w", err)
		}
		m := *v.Manifest
		m.ReplacedBy = replacedBy
		if replacedBy == tool {
			return errors.New("a tool cannot be replaced by itself")
		}
		if replacedBy != "" {
			if _, err := r.latest(idx, replacedBy, 0, manifest.Approved, manifest.Deprecated); err != nil {
				return fmt.Errorf("--replaced-by: %w", err)
			}
		}
		warnings, err := r.checkSet(idx, []*manifest.Manifest{&m}, manifest.Deprecated)
		if err != nil {
			return err
		}
		if o.Note == "" {
			o.Note = fmt.Sprintf("deprecated from v%d", v.Version)
		}
		e, err := r.appendVersion(idx, &m, manifest.Deprecated, v.Author, o.By, o)
		out = Published{Tool: tool, Entry: e, Warnings: warnings}
		return err
	})
	return out, err
}

// Rollback publishes version (its manifest and status) again as the newest version, keeping
// the history intact.
func (r *Registry) Rollback(tool string, version int, o WriteOptions) (Published, error) {
	var out Published
	err := r.update(o, func(idx *Index) error {
		if version < 1 {
			return errors.New("rollback needs --version N")
		}
		v, err := r.latest(idx, tool, version, manifest.Draft, manifest.Approved, manifest.Deprecated)
		if err != nil {
			return err
		}
		warnings, err := r.checkSet(idx, []*manifest.Manifest{v.Manifest}, v.Status)
		if err != nil {
			return err
		}
		if o.Note == "" {
			o.Note = fmt.Sprintf("rollback to v%d", version)
		}
		// The new version is approved by whoever published it again, not by vN's approver.
		approver := ""
		if v.Status != manifest.Draft {
			approver = o.By
		}
		e, err := r.appendVersion(idx, v.Manifest, v.Status, o.By, approver, o)
		out = Published{Tool: tool, Entry: e, Warnings: warnings}
		return err
	})
	return out, err
}

// Sign writes index.json again, signed with o.Signer and the next sequence, without a new
// version: after a writer key rotation, or to upgrade an index written before sequences existed.
// Every version is checked first (as Verify does, without trust), so a damaged registry is not
// signed over.
func (r *Registry) Sign(o WriteOptions) (int64, error) {
	if o.Signer == nil {
		return 0, errors.New("manifests sign needs --key")
	}
	if _, errs := r.Verify(nil); len(errs) > 0 {
		return 0, fmt.Errorf("the registry has problems, fix them before signing it: %w", errors.Join(errs...))
	}
	var seq int64
	err := r.update(o, func(idx *Index) error {
		seq = idx.Sequence + 1
		if idx.ID == "" { // an index written before ids: it gets one now
			idx.ID = newRegistryID()
		}
		return nil
	})
	return seq, err
}

// ReadVersion reads one version with its checks (no signature check).
func (r *Registry) ReadVersion(tool string, version int) (*Version, error) {
	idx, err := r.readIndex(false)
	if err != nil {
		return nil, err
	}
	return r.latest(idx, tool, version, manifest.Draft, manifest.Approved, manifest.Deprecated)
}
