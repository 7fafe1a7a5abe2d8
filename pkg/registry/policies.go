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
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/google/renameio/v2"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
	"github.com/reversi-gitops/reversi/pkg/policy"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// Policies are versioned and signed in the registry like manifests (issue 21, GitOps): index.json
// lists every policy's versions under `policies` (the same Entry as a tool's), each version is
// `policies/<escaped name>/v<N>.json` holding the policy's canonical JSON, and its signature
// covers `reversi-policy:<name>@<version>:<checksum>` (signing.PolicyMessage), never a manifest's
// message. The served policy of a name is its newest non-draft version; the index signature
// covers the served policies' digest (IndexMessage v3), so a reader holding only the served
// versions can tell one dropped, added or swapped.

// PolicyVersionFile is policies/<name>/v<N>.json: the entry, the policy's name and its canonical
// JSON (so the checksum can be recomputed from the file alone).
type PolicyVersionFile struct {
	Policy string `json:"policy"`
	Entry
	Document json.RawMessage `json:"document"`
}

// PolicyVersion is one policy version read from its file, with every check passed.
type PolicyVersion struct {
	Name string
	Entry
	Policy *apipolicy.Policy
	// Canonical is the policy's canonical JSON: the bytes Checksum covers.
	Canonical []byte
}

// PolicyLabel is how problems name a policy in their Tool field: "policy <name>" (a policy and
// a tool may share a name).
func PolicyLabel(name string) string { return "policy " + name }

// policyDir is the policy's folder, relative to the registry: `policies/<escaped name>`.
func policyDir(name string) (string, error) {
	if name == "" {
		return "", errors.New("empty policy name")
	}
	el := url.PathEscape(name)
	if el == "." || el == ".." {
		return "", fmt.Errorf("policy name %q cannot be a folder name", name)
	}
	return path.Join("policies", el), nil
}

func policyVersionPath(name string, version int) (string, error) {
	dir, err := policyDir(name)
	if err != nil {
		return "", err
	}
	return path.Join(dir, "v"+strconv.Itoa(version)+".json"), nil
}

// VerifyPolicyEntry checks one policy version from its entry and canonical JSON bytes: the
// SHA-256 of the bytes is the entry's checksum, the bytes decode strictly to a policy named
// name that compiles, and with trust the signature is a trusted key's over
// signing.PolicyMessage. full also requires the bytes to be in canonical form. Registry loads
// and the gateway's re-verification of rendered ConfigMaps both use it. A refused signature
// wraps a signing error.
func VerifyPolicyEntry(name string, e Entry, canonical []byte, trust *signing.TrustSet, full bool) (*apipolicy.Policy, error) {
	sum := sha256.Sum256(canonical)
	if got := hex.EncodeToString(sum[:]); got != e.Checksum {
		return nil, fmt.Errorf("edited after publishing: the policy's checksum is %s, the recorded one %s; publish changes as a new version instead (reversi policy publish)", short(got), short(e.Checksum))
	}
	if e.Status != manifest.Draft && e.Status != manifest.Approved {
		return nil, fmt.Errorf("status %q: a policy version is draft or approved; it was edited", e.Status)
	}
	var raw any
	dec := json.NewDecoder(bytes.NewReader(canonical))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("the policy is not JSON: %v", err)
	}
	p, errs := apipolicy.Validate(raw)
	if len(errs) > 0 {
		return nil, fmt.Errorf("the stored policy is invalid: %v", errors.Join(errs...))
	}
	if p.Name != name {
		return nil, fmt.Errorf("the stored policy is named %s, its entry %s: it was edited; restore it", p.Name, name)
	}
	if _, errs := policy.Compile([]*apipolicy.Policy{p}); len(errs) > 0 {
		return nil, fmt.Errorf("the stored policy does not compile: %v", errors.Join(errs...))
	}
	if full {
		c, err := apipolicy.CanonicalJSON(p)
		if err != nil {
			return nil, err
		}
		if !bytes.Equal(c, canonical) {
			return nil, errors.New("the stored policy is not in canonical form: it was not written by reversi policy; restore it")
		}
	}
	if !e.Signed() {
		if trust != nil {
			return nil, fmt.Errorf("%w, but trusted keys are set: every policy version must be signed by one of them; publish again with reversi policy publish --key", signing.ErrNotSigned)
		}
		return p, nil
	}
	sig, err := base64.StdEncoding.DecodeString(e.Signature)
	if err != nil || e.KeyID == "" {
		return nil, fmt.Errorf("the signature or key id is %w", signing.ErrMalformedSignature)
	}
	if trust != nil {
		if err := trust.Verify(e.KeyID, sig, signing.PolicyMessage(name, e.Version, e.Checksum)); err != nil {
			return nil, fmt.Errorf("%w: it is not a policy signature by a trusted key (a manifest's signature never verifies as a policy's)", err)
		}
	}
	return p, nil
}

// readPolicyVersion reads and checks one policy version against its index entry, as
// readVersion does for a tool.
func (r *Registry) readPolicyVersion(fsys fs.FS, name string, want Entry, trust *signing.TrustSet, full bool) (*PolicyVersion, error) {
	label := PolicyLabel(name)
	rel, err := policyVersionPath(name, want.Version)
	if err != nil {
		return nil, &Problem{File: IndexFile, Tool: label, Message: err.Error() + ": index.json was edited; restore it"}
	}
	canonical, err := readVersionFile(fsys, rel, label, name, "policy", want, func(data []byte) (string, int, Entry, json.RawMessage, error) {
		var vf PolicyVersionFile
		err := strictJSON(data, &vf)
		return vf.Policy, vf.Version, vf.Entry, vf.Document, err
	})
	if err != nil {
		return nil, err
	}
	p, err := VerifyPolicyEntry(name, want, canonical, trust, full)
	if err != nil {
		return nil, &Problem{File: rel, Tool: label, Version: want.Version, Message: err.Error(), Err: err}
	}
	return &PolicyVersion{Name: name, Entry: want, Policy: p, Canonical: canonical}, nil
}

func (idx *Index) policyNames() []string {
	names := make([]string, 0, len(idx.Policies))
	for n := range idx.Policies {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// loadPolicies adds the served version of every policy to snap (drafts are absent, as a
// draft manifest is) and compiles them together; it returns every problem.
func (r *Registry) loadPolicies(fsys fs.FS, idx *Index, trust *signing.TrustSet, snap *Snapshot) []error {
	var errs []error
	served := idx.ServedPolicies()
	for _, name := range idx.policyNames() {
		if err := checkEntries(PolicyLabel(name), idx.Policies[name]); err != nil {
			errs = append(errs, err)
			continue
		}
		e, ok := served[name]
		if !ok {
			continue
		}
		v, err := r.readPolicyVersion(fsys, name, e, trust, false)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		snap.Policies = append(snap.Policies, v.Policy)
		snap.PolicyEntries[name] = v.Entry
		snap.PolicyCanonical[name] = v.Canonical
	}
	if len(errs) == 0 && len(snap.Policies) > 0 {
		if _, cerrs := policy.Compile(snap.Policies); len(cerrs) > 0 {
			for _, e := range cerrs {
				errs = append(errs, &Problem{File: IndexFile, Message: "the served policies do not compile together: " + e.Error(), Err: e})
			}
		}
	}
	return errs
}

// PolicySet compiles the snapshot's served policies (nil for none).
func (s *Snapshot) PolicySet() (*policy.Set, []error) {
	if s == nil || len(s.Policies) == 0 {
		return nil, nil
	}
	return policy.Compile(s.Policies)
}

// PolicyHistory returns the entries of a policy, oldest first.
func (r *Registry) PolicyHistory(name string) ([]Entry, error) {
	idx, err := r.readIndex(false)
	if err != nil {
		return nil, err
	}
	es, ok := idx.Policies[name]
	if !ok {
		return nil, fmt.Errorf("policy %s is not in the registry %s", name, r.Dir)
	}
	return es, nil
}

// PolicyNames lists the registry's policies, sorted.
func (r *Registry) PolicyNames() ([]string, error) {
	idx, err := r.readIndex(false)
	if err != nil {
		return nil, err
	}
	return idx.policyNames(), nil
}

// ReadPolicyVersion reads one policy version with its checks (no signature check).
func (r *Registry) ReadPolicyVersion(name string, version int) (*PolicyVersion, error) {
	idx, err := r.readIndex(false)
	if err != nil {
		return nil, err
	}
	return r.pickPolicy(idx, name, version, false)
}

// pickPolicy reads a policy's version (version > 0), or its newest version (drafts only: its
// newest draft).
func (r *Registry) pickPolicy(idx *Index, name string, version int, draftOnly bool) (*PolicyVersion, error) {
	es, ok := idx.Policies[name]
	if !ok {
		return nil, fmt.Errorf("policy %s is not in the registry %s: publish it first (reversi policy publish)", name, r.Dir)
	}
	var pick *Entry
	if version > 0 {
		if version > len(es) {
			return nil, fmt.Errorf("policy %s has no v%d (newest is v%d)", name, version, len(es))
		}
		pick = &es[version-1]
		if draftOnly && pick.Status != manifest.Draft {
			return nil, fmt.Errorf("policy %s v%d is %s, not a draft", name, version, pick.Status)
		}
	} else {
		pick = &es[len(es)-1]
	}
	fsys, closeFS, err := r.files()
	if err != nil {
		return nil, err
	}
	defer closeFS()
	return r.readPolicyVersion(fsys, name, *pick, nil, false)
}

// PublishedPolicy is one policy version written by a writer.
type PublishedPolicy struct {
	Name string
	Entry
}

// appendPolicyVersion stamps p as the policy's next version with status, signs it, writes its
// file (never overwriting one) and lists it in idx.
func (r *Registry) appendPolicyVersion(idx *Index, p *apipolicy.Policy, status manifest.Status, author, approver string, o WriteOptions) (Entry, error) {
	canonical, err := apipolicy.CanonicalJSON(p)
	if err != nil {
		return Entry{}, err
	}
	sum := sha256.Sum256(canonical)
	e := Entry{Version: len(idx.Policies[p.Name]) + 1, Status: status, Checksum: hex.EncodeToString(sum[:]), Author: author, Approver: approver, Time: o.now(), Note: o.Note}
	if o.Signer != nil {
		sig, err := o.Signer.Sign(signing.PolicyMessage(p.Name, e.Version, e.Checksum))
		if err != nil {
			return Entry{}, err
		}
		e.KeyID, e.Signature = o.Signer.KeyID, base64.StdEncoding.EncodeToString(sig)
	}
	rel, err := policyVersionPath(p.Name, e.Version)
	if err != nil {
		return Entry{}, err
	}
	full := filepath.Join(r.Dir, filepath.FromSlash(rel))
	if _, err := os.Lstat(full); err == nil {
		return Entry{}, fmt.Errorf("%s exists but index.json does not list it: versions are immutable; run reversi policy verify", rel)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(PolicyVersionFile{Policy: p.Name, Entry: e, Document: canonical}); err != nil {
		return Entry{}, err
	}
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		return Entry{}, err
	}
	if err := renameio.WriteFile(full, buf.Bytes(), 0o644); err != nil {
		return Entry{}, err
	}
	idx.Policies[p.Name] = append(idx.Policies[p.Name], e)
	return e, nil
}

// checkPolicies compiles the policies the registry would serve once ps are written with
// status (approved: they replace the served versions of their names), so that a write never
// makes a served set that does not compile.
func (r *Registry) checkPolicies(idx *Index, ps []*apipolicy.Policy, status manifest.Status) error {
	for _, p := range ps {
		if _, errs := policy.Compile([]*apipolicy.Policy{p}); len(errs) > 0 {
			return fmt.Errorf("policy %s does not compile: %w", p.Name, errors.Join(errs...))
		}
	}
	if status != manifest.Approved {
		return nil
	}
	fsys, closeFS, err := r.files()
	if err != nil {
		return err
	}
	defer closeFS()
	next := map[string]*apipolicy.Policy{}
	for name, e := range idx.ServedPolicies() {
		v, err := r.readPolicyVersion(fsys, name, e, nil, false)
		if err != nil {
			return err
		}
		next[name] = v.Policy
	}
	for _, p := range ps {
		next[p.Name] = p
	}
	set := make([]*apipolicy.Policy, 0, len(next))
	for _, p := range next {
		set = append(set, p)
	}
	if _, errs := policy.Compile(set); len(errs) > 0 {
		return fmt.Errorf("the served policies would not compile together: %w", errors.Join(errs...))
	}
	return nil
}

// PublishPolicies adds every policy (decoded and valid: api/policy) as a new version of its
// name with status (draft by default, or approved by o.By).
func (r *Registry) PublishPolicies(ps []*apipolicy.Policy, status manifest.Status, o WriteOptions) ([]PublishedPolicy, error) {
	if status == "" {
		status = manifest.Draft
	}
	if status != manifest.Draft && status != manifest.Approved {
		return nil, fmt.Errorf("policy publish --status must be draft or approved, not %s", status)
	}
	if len(ps) == 0 {
		return nil, errors.New("no policy to publish")
	}
	seen := map[string]bool{}
	for _, p := range ps {
		if seen[p.Name] {
			return nil, fmt.Errorf("policy %s is given twice: publish one", p.Name)
		}
		seen[p.Name] = true
	}
	var out []PublishedPolicy
	err := r.update(o, func(idx *Index) error {
		if err := r.checkPolicies(idx, ps, status); err != nil {
			return err
		}
		approver := ""
		if status == manifest.Approved {
			approver = o.By
		}
		for _, p := range ps {
			e, err := r.appendPolicyVersion(idx, p, status, o.By, approver, o)
			if err != nil {
				return err
			}
			out = append(out, PublishedPolicy{Name: p.Name, Entry: e})
		}
		return nil
	})
	return out, err
}

// ApprovePolicy promotes a policy draft (the newest version when it is a draft, or version) to
// a new approved version by o.By; with fourEyes the draft's author may not approve it.
func (r *Registry) ApprovePolicy(name string, version int, fourEyes bool, o WriteOptions) (PublishedPolicy, error) {
	var out PublishedPolicy
	err := r.update(o, func(idx *Index) error {
		if es := idx.Policies[name]; version == 0 && len(es) > 0 && es[len(es)-1].Status != manifest.Draft {
			return fmt.Errorf("policy %s has no pending draft: the newest version, v%d, is %s; name an older draft with --version", name, len(es), es[len(es)-1].Status)
		}
		v, err := r.pickPolicy(idx, name, version, true)
		if err != nil {
			return err
		}
		if fourEyes && v.Author == o.By {
			return fmt.Errorf("four eyes: %s wrote policy %s v%d and cannot approve it; ask another reviewer", o.By, name, v.Version)
		}
		if err := r.checkPolicies(idx, []*apipolicy.Policy{v.Policy}, manifest.Approved); err != nil {
			return err
		}
		if o.Note == "" {
			o.Note = fmt.Sprintf("approved from v%d", v.Version)
		}
		e, err := r.appendPolicyVersion(idx, v.Policy, manifest.Approved, v.Author, o.By, o)
		out = PublishedPolicy{Name: name, Entry: e}
		return err
	})
	return out, err
}
