package registry

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// Version is one version read from its file, with every check passed.
type Version struct {
	Tool string
	Entry
	Manifest *manifest.Manifest
	// Canonical is the manifest's canonical JSON as stored: the bytes Checksum covers.
	Canonical []byte
}

// Problem is one thing wrong with a registry: the file (relative to the registry), the tool
// and version when known, and what is wrong and what to do. Err, when set, is the error the
// Message was made from; errors.Is and errors.As see it (IsSignatureError, say).
type Problem struct {
	File    string
	Tool    string
	Version int
	Message string
	Err     error
}

func (p *Problem) Error() string {
	where := p.File
	if p.Tool != "" {
		where += ": " + p.Tool
		if p.Version > 0 {
			where += fmt.Sprintf(" v%d", p.Version)
		}
	}
	return where + ": " + p.Message
}

// Unwrap returns the cause, nil when the problem has none.
func (p *Problem) Unwrap() error { return p.Err }

// Snapshot is a loaded registry: the newest non-draft version of each tool, verified.
type Snapshot struct {
	// Manifests are the loaded manifests, sorted by tool.
	Manifests []*manifest.Manifest
	// Entries holds the loaded version of each tool.
	Entries map[string]Entry
	// Canonical holds each loaded manifest's canonical JSON, the bytes its checksum covers.
	Canonical map[string][]byte
	// Index proves the served set: the index's sequence, history digest and signature.
	Index IndexProof
	// Policies are the served policies (the newest non-draft version of each), verified like
	// the manifests and compiled together, sorted by name; PolicyEntries and PolicyCanonical
	// hold their entries and canonical JSON by name.
	Policies        []*apipolicy.Policy
	PolicyEntries   map[string]Entry
	PolicyCanonical map[string][]byte
}

// readVersion reads and checks one version against its index entry: the file exists inside
// the registry, is strict JSON, names the same tool and version, holds a valid manifest whose
// checksum is the recorded one, agrees with index.json, and (with trust) carries a valid
// signature by a trusted key.
//
// full also checks that the stored manifest is in canonical form (Verify's audit); loads skip
// it, since the checksum already binds the bytes that are interpreted.
func (r *Registry) readVersion(fsys fs.FS, tool string, want Entry, trust *signing.TrustSet, full bool) (*Version, error) {
	rel, err := versionPath(tool, want.Version)
	if err != nil {
		return nil, &Problem{File: IndexFile, Tool: tool, Message: err.Error() + ": index.json was edited; restore it"}
	}
	canonical, err := readVersionFile(fsys, rel, tool, tool, "manifest", want, func(data []byte) (string, int, Entry, json.RawMessage, error) {
		var vf VersionFile
		err := strictJSON(data, &vf)
		return vf.Tool, vf.Version, vf.Entry, vf.Manifest, err
	})
	if err != nil {
		return nil, err
	}
	m, err := VerifyEntry(tool, want, canonical, trust, full)
	if err != nil {
		return nil, &Problem{File: rel, Tool: tool, Version: want.Version, Message: err.Error(), Err: err}
	}
	return &Version{Tool: tool, Entry: want, Manifest: m, Canonical: canonical}, nil
}

// readVersionFile reads the version file rel of name (problems name label: the tool, or
// "policy <name>") and checks it against its index entry want: it exists inside the registry,
// is strict JSON (decode reads its name, version, entry and document), names the same name and
// version, and agrees with index.json. It returns the document compacted: the bytes the
// checksum and signature cover (the file holds them indented). what ("manifest", "policy")
// names the document in messages.
func readVersionFile(fsys fs.FS, rel, label, name, what string, want Entry, decode func(data []byte) (string, int, Entry, json.RawMessage, error)) ([]byte, error) {
	bad := func(format string, args ...any) error {
		return &Problem{File: rel, Tool: label, Version: want.Version, Message: fmt.Sprintf(format, args...)}
	}
	data, err := fs.ReadFile(fsys, rel)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, bad("the version file is missing: restore it from version control")
	}
	if err != nil {
		return nil, bad("%v", err)
	}
	gotName, gotVersion, entry, doc, err := decode(data)
	if err != nil {
		return nil, bad("%v: the file is damaged; restore it from version control", err)
	}
	if gotName != name || gotVersion != want.Version {
		held := gotName
		if label != name {
			held = what + " " + gotName
		}
		return nil, bad("the file holds %s v%d: restore it from version control", held, gotVersion)
	}
	if entry != want {
		return nil, &Problem{File: IndexFile, Tool: label, Version: want.Version, Message: fmt.Sprintf("index.json disagrees with %s (%s): index.json was edited; restore it", rel, entryDiff(want, entry))}
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, doc); err != nil {
		return nil, bad("the %s is not JSON: %v", what, err)
	}
	return compact.Bytes(), nil
}

// VerifyEntry checks one version from its entry and the manifest's canonical JSON bytes: the
// SHA-256 of the bytes is the entry's checksum (so the bytes interpreted are the bytes
// signed), the manifest is valid and names the entry's tool, version and status, and with
// trust the signature is a trusted key's over `reversi-manifest:<tool>@<version>:<checksum>`.
// full also requires the bytes to be in canonical form (an audit; the checksum already binds
// them). Registry loads and the gateway's re-verification of rendered ConfigMaps both use it.
// A refused signature wraps a signing error (signing.ErrNotSigned, ErrMalformedSignature,
// ErrUntrusted, ErrBadSignature).
func VerifyEntry(tool string, e Entry, canonical []byte, trust *signing.TrustSet, full bool) (*manifest.Manifest, error) {
	sum := sha256.Sum256(canonical)
	if got := hex.EncodeToString(sum[:]); got != e.Checksum {
		return nil, fmt.Errorf("edited after publishing: the manifest's checksum is %s, the recorded one %s; publish changes as a new version instead", short(got), short(e.Checksum))
	}
	var raw any
	dec := json.NewDecoder(bytes.NewReader(canonical))
	dec.UseNumber() // integers above 2^53 stay exact
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("the manifest is not JSON: %v", err)
	}
	m, errs := manifest.Validate(raw)
	if len(errs) > 0 {
		return nil, fmt.Errorf("the stored manifest is invalid: %v", errors.Join(errs...))
	}
	if m.Tool != tool || m.Version != e.Version || m.Status != e.Status {
		return nil, fmt.Errorf("the stored manifest says %s v%d %s, its entry %s v%d %s: it was edited; restore it", m.Tool, m.Version, m.Status, tool, e.Version, e.Status)
	}
	if full {
		c, err := manifest.CanonicalJSON(m)
		if err != nil {
			return nil, err
		}
		if !bytes.Equal(c, canonical) {
			return nil, errors.New("the stored manifest is not in canonical form: it was not written by reversi manifests; restore it")
		}
	}
	if err := checkSignature(tool, e, trust); err != nil {
		return nil, err
	}
	return m, nil
}

// checkSignature verifies a version's signature against trust. Without trust a signature is
// only checked to be well formed; with trust a missing signature is refused (fail closed).
func checkSignature(tool string, e Entry, trust *signing.TrustSet) error {
	if !e.Signed() {
		if trust != nil {
			return fmt.Errorf("%w, but trusted keys are set: every version must be signed by one of them; publish again with --key", signing.ErrNotSigned)
		}
		return nil
	}
	sig, err := base64.StdEncoding.DecodeString(e.Signature)
	if err != nil || e.KeyID == "" {
		return fmt.Errorf("the signature or key id is %w", signing.ErrMalformedSignature)
	}
	if trust == nil {
		return nil
	}
	return trust.Verify(e.KeyID, sig, signing.Message(tool, e.Version, e.Checksum))
}

func short(sum string) string {
	if len(sum) > 12 {
		return sum[:12]
	}
	return sum
}

// entryDiff names the fields where two entries differ.
func entryDiff(a, b Entry) string {
	var fields []string
	add := func(name string, differ bool) {
		if differ {
			fields = append(fields, name)
		}
	}
	add("status", a.Status != b.Status)
	add("checksum", a.Checksum != b.Checksum)
	add("author", a.Author != b.Author)
	add("approver", a.Approver != b.Approver)
	add("time", !a.Time.Equal(b.Time))
	add("note", a.Note != b.Note)
	add("key_id", a.KeyID != b.KeyID)
	add("signature", a.Signature != b.Signature)
	return fmt.Sprintf("%v differ", fields)
}

// checkEntries refuses an index whose versions are not 1, 2, 3… in order.
func checkEntries(tool string, es []Entry) error {
	if len(es) == 0 {
		return &Problem{File: IndexFile, Tool: tool, Message: "no versions listed: index.json was edited; restore it"}
	}
	for i, e := range es {
		if e.Version != i+1 {
			return &Problem{File: IndexFile, Tool: tool, Message: fmt.Sprintf("versions are not 1..%d in order (found v%d at position %d): index.json was edited; restore it", len(es), e.Version, i+1)}
		}
	}
	return nil
}

// Load reads the newest non-draft version of every tool (drafts are not enforceable and are
// simply absent), checks each as readVersion does, and then the set as a whole (cross-manifest
// rules). A loaded tool whose compensation, required tool, verification tool or replaced_by has
// only drafts is a problem: the draft is absent, so its rollback would run a tool nobody
// approved (seed: "Once all manifests are loaded: the compensation tool … must exist"). A
// draft-only tool's own references are checked when it is approved. It returns the snapshot
// of the tools that passed and every problem; callers that enforce must treat any problem as
// a failed load (see Loader).
func (r *Registry) Load(trust *signing.TrustSet) (*Snapshot, []error) {
	idx, fsys, closeFS, errs := r.open(trust)
	if idx == nil {
		return nil, errs
	}
	defer closeFS()

	type job struct {
		tool      string
		entry     Entry
		draftOnly bool
	}
	var jobs []job
	for _, tool := range idx.tools() {
		es := idx.Tools[tool]
		if err := checkEntries(tool, es); err != nil {
			errs = append(errs, err)
			continue
		}
		j := job{tool: tool, entry: es[len(es)-1], draftOnly: true}
		for i := len(es) - 1; i >= 0; i-- {
			if es[i].Status != manifest.Draft {
				j = job{tool: tool, entry: es[i]}
				break
			}
		}
		jobs = append(jobs, j)
	}
	versions := make([]*Version, len(jobs))
	verrs := make([]error, len(jobs))
	parallel(len(jobs), func(i int) {
		t := trust
		if jobs[i].draftOnly {
			t = nil // a draft is not loaded, so its signature does not gate the load
		}
		versions[i], verrs[i] = r.readVersion(fsys, jobs[i].tool, jobs[i].entry, t, false)
	})
	proof, err := idx.Proof()
	if err != nil {
		return nil, append(errs, err)
	}
	snap := &Snapshot{Entries: map[string]Entry{}, Canonical: map[string][]byte{}, Index: proof,
		PolicyEntries: map[string]Entry{}, PolicyCanonical: map[string][]byte{}}
	errs = append(errs, r.loadPolicies(fsys, idx, trust, snap)...)
	set := make([]*manifest.Manifest, 0, len(jobs))
	draftOnly := map[string]bool{}
	for i, v := range versions {
		switch {
		case jobs[i].draftOnly && verrs[i] == nil:
			draftOnly[v.Tool] = true
			set = append(set, v.Manifest)
		case jobs[i].draftOnly:
			// A damaged draft is reported by Verify; it does not block what is enforced.
		case verrs[i] != nil:
			errs = append(errs, verrs[i])
		default:
			snap.Manifests = append(snap.Manifests, v.Manifest)
			snap.Entries[v.Tool] = v.Entry
			snap.Canonical[v.Tool] = v.Canonical
			set = append(set, v.Manifest)
		}
	}
	for _, e := range manifest.ValidateSet(set) {
		var fe *manifest.FieldError
		if !errors.As(e, &fe) {
			errs = append(errs, &Problem{File: IndexFile, Message: e.Error()})
			continue
		}
		if draftOnly[fe.Tool] {
			continue // the draft's own references are checked when it is approved
		}
		// Named by tool and version, so the controller lists the tool as invalid.
		p := &Problem{File: IndexFile, Tool: fe.Tool, Version: snap.Entries[fe.Tool].Version, Message: fe.Message}
		if fe.Path != "" {
			p.Message = fe.Path + ": " + fe.Message
		}
		errs = append(errs, p)
	}
	return snap, errs
}

// VerifyReport counts what Verify checked.
type VerifyReport struct {
	Tools, Versions, Signed int
	// Policies, PolicyVersions and PolicySigned count the policies and their versions.
	Policies, PolicyVersions, PolicySigned int
}

// Verify checks every version of every tool (not only the loaded ones): file, checksum,
// agreement with index.json and, with trust, the signature. It returns every problem.
func (r *Registry) Verify(trust *signing.TrustSet) (VerifyReport, []error) {
	var rep VerifyReport
	idx, fsys, closeFS, errs := r.open(trust)
	if idx == nil {
		return rep, errs
	}
	defer closeFS()
	type job struct {
		tool  string
		entry Entry
	}
	var jobs []job
	for _, tool := range idx.tools() {
		rep.Tools++
		es := idx.Tools[tool]
		if err := checkEntries(tool, es); err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range es {
			jobs = append(jobs, job{tool, e})
		}
	}
	npol := 0
	for _, name := range idx.policyNames() {
		rep.Policies++
		es := idx.Policies[name]
		if err := checkEntries(PolicyLabel(name), es); err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range es {
			jobs = append(jobs, job{name, e})
			npol++
		}
	}
	first := len(jobs) - npol // jobs from here on are policy versions
	verrs := make([]error, len(jobs))
	parallel(len(jobs), func(i int) {
		if i >= first {
			_, verrs[i] = r.readPolicyVersion(fsys, jobs[i].tool, jobs[i].entry, trust, true)
			return
		}
		_, verrs[i] = r.readVersion(fsys, jobs[i].tool, jobs[i].entry, trust, true)
	})
	for i, j := range jobs {
		switch {
		case i >= first:
			rep.PolicyVersions++
			if j.entry.Signed() {
				rep.PolicySigned++
			}
		default:
			rep.Versions++
			if j.entry.Signed() {
				rep.Signed++
			}
		}
		if verrs[i] != nil {
			errs = append(errs, verrs[i])
		}
	}
	return rep, errs
}

// open reads index.json and checks what concerns the registry as a whole, for loads and
// audits alike (fail closed): with trust the index's signature; that it lists at least one
// tool; that every version file is listed (a version dropped from the index is not silently
// skipped). idx is nil when nothing more can be read; the caller closes root.
func (r *Registry) open(trust *signing.TrustSet) (idx *Index, fsys fs.FS, closeFS func(), errs []error) {
	idx, err := r.readIndex(false)
	if err != nil {
		return nil, nil, nil, []error{err}
	}
	if fsys, closeFS, err = r.files(); err != nil {
		return nil, nil, nil, []error{err}
	}
	if err := idx.verify(trust); err != nil {
		errs = append(errs, &Problem{File: IndexFile, Message: err.Error(), Err: err})
	}
	if len(idx.Tools) == 0 && len(idx.Policies) == 0 {
		errs = append(errs, &Problem{File: IndexFile, Message: "lists no tools: a registry that enforces nothing is refused; restore index.json or publish manifests"})
	}
	return idx, fsys, closeFS, append(errs, r.strayFiles(fsys, idx)...)
}

// files is the registry's files for reading: the FS given to NewFS, or the folder opened as
// an os.Root, so that no path or link inside can lead a read out of it.
func (r *Registry) files() (fs.FS, func(), error) {
	if r.fsys != nil {
		return r.fsys, func() {}, nil
	}
	root, err := os.OpenRoot(r.Dir)
	if err != nil {
		return nil, nil, err
	}
	return root.FS(), func() { root.Close() }, nil
}

// strayFiles reports version files that index.json does not list (written outside the
// workflow, or left by an index edit).
func (r *Registry) strayFiles(fsys fs.FS, idx *Index) []error {
	listed := map[string]bool{}
	for tool, es := range idx.Tools {
		for _, e := range es {
			if p, err := versionPath(tool, e.Version); err == nil {
				listed[p] = true
			}
		}
	}
	var errs []error
	for name, es := range idx.Policies {
		for _, e := range es {
			if p, err := policyVersionPath(name, e.Version); err == nil {
				listed[p] = true
			}
		}
	}
	for dir, how := range map[string]string{"tools": "reversi manifests", "policies": "reversi policy"} {
		_ = fs.WalkDir(fsys, dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || filepath.Ext(p) != ".json" {
				return nil
			}
			if !listed[p] {
				errs = append(errs, &Problem{File: p, Message: "not listed in index.json: publish through " + how + ", or remove the file"})
			}
			return nil
		})
	}
	sort.SliceStable(errs, func(i, j int) bool { return errs[i].(*Problem).File < errs[j].(*Problem).File })
	return errs
}

// parallel runs f(0..n-1) on one worker per CPU: the checks are CPU-bound (JSON, SHA-256,
// Ed25519).
func parallel(n int, f func(i int)) {
	workers := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	var next atomic.Int64
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				f(i)
			}
		}()
	}
	wg.Wait()
}

// Loader keeps the last good snapshot of a registry: a reload that finds any problem is
// refused and the previous snapshot keeps serving (fail closed, lose nothing).
type Loader struct {
	Registry *Registry
	mu       sync.Mutex
	current  atomic.Pointer[Snapshot]
}

// Current is the last good snapshot, nil before the first good load.
func (l *Loader) Current() *Snapshot { return l.current.Load() }

// Reload loads the registry with trust. On success the new snapshot replaces the current one
// and is returned; on any problem the current snapshot stays and the problems are returned.
func (l *Loader) Reload(trust *signing.TrustSet) (*Snapshot, []error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	snap, errs := l.Registry.Load(trust)
	if len(errs) > 0 {
		return l.current.Load(), errs
	}
	l.current.Store(snap)
	return snap, nil
}
