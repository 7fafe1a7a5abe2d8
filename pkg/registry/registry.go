// Package registry is the signed manifest registry: a folder of immutable manifest versions,
// `index.json` plus `tools/<tool>/v<N>.json`, written by publish/approve/deprecate/rollback
// and loaded (newest non-draft version of each tool) with every checksum and, given trusted
// keys, every signature checked. The controller loads registries with this same code.
//
// Source: seed "Tool manifests", Registry: versions, signing, trust.
package registry

import (
	"bytes"
	"crypto/rand"
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
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// Format is the `format` value of index.json.
const Format = "reversi.dev/registry/v1"

// IndexFile is the registry's index, at the root of the registry folder.
const IndexFile = "index.json"

// Entry describes one version. It appears in index.json and, identically, in the version file.
// Checksum is the lowercase hex SHA-256 of the manifest's canonical JSON; Signature is the
// base64 Ed25519 signature of `reversi-manifest:<tool>@<version>:<checksum>` by KeyID.
type Entry struct {
	Version   int             `json:"version"`
	Status    manifest.Status `json:"status"`
	Checksum  string          `json:"checksum"`
	Author    string          `json:"author"`
	Approver  string          `json:"approver,omitempty"`
	Time      time.Time       `json:"time"`
	Note      string          `json:"note,omitempty"`
	KeyID     string          `json:"key_id,omitempty"`
	Signature string          `json:"signature,omitempty"`
}

// Signed reports whether the version carries a signature.
func (e Entry) Signed() bool { return e.Signature != "" }

// Short is the first 12 characters of the checksum, as the seed prints it.
func (e Entry) Short() string {
	if len(e.Checksum) < 12 {
		return e.Checksum
	}
	return e.Checksum[:12]
}

// Index is index.json: every tool's versions, oldest first, and a Sequence that grows by one
// with every write. With a signing key, the last writer signs the index too (KeyID, Signature:
// base64 Ed25519 over IndexMessage), so neither the set of versions, their order, authors and
// approvers, nor the set the registry serves can be edited, replayed under a newer sequence or
// mixed with another registry's versions without a key.
type Index struct {
	Format string `json:"format"`
	// ID names the registry: random, made by its first write and never changed, and covered
	// by the index signature, so a registry's signed folder cannot pass for another's.
	ID       string             `json:"id"`
	Sequence int64              `json:"sequence"`
	Tools    map[string][]Entry `json:"tools"`
	// Policies holds every policy's versions, oldest first, as Tools does for manifests
	// (`policies/<name>/v<N>.json`); absent in a registry without policies.
	Policies  map[string][]Entry `json:"policies,omitempty"`
	KeyID     string             `json:"key_id,omitempty"`
	Signature string             `json:"signature,omitempty"`
}

// Served is the version each tool serves: its newest non-draft version (a tool with only drafts
// serves none; seed: "a draft ... is simply absent from the loaded registry").
func (idx *Index) Served() map[string]Entry { return served(idx.Tools) }

// ServedPolicies is the version each policy serves: its newest non-draft version.
func (idx *Index) ServedPolicies() map[string]Entry { return served(idx.Policies) }

func served(versions map[string][]Entry) map[string]Entry {
	out := make(map[string]Entry, len(versions))
	for tool, es := range versions {
		for i := len(es) - 1; i >= 0; i-- {
			if es[i].Status != manifest.Draft {
				out[tool] = es[i]
				break
			}
		}
	}
	return out
}

// SetDigest is the digest of a served set: `sha256:<hex>` over the lines
// `<tool>@<version>:<checksum>\n` in tool order. Equal digests mean the same enforced manifests;
// the controller's renderings (pkg/bundle) carry the same value.
func SetDigest(set map[string]Entry) string {
	tools := make([]string, 0, len(set))
	for t := range set {
		tools = append(tools, t)
	}
	sort.Strings(tools)
	h := sha256.New()
	for _, t := range tools {
		fmt.Fprintf(h, "%s@%d:%s\n", t, set[t].Version, set[t].Checksum)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// PolicyDigest is the digest of a served policy set: SetDigest over the lines
// `<policy>@<version>:<checksum>\n`, and "" for no policy at all (so that an index, snapshot
// or rendering without policies keeps the form it had before policies existed).
func PolicyDigest(set map[string]Entry) string {
	if len(set) == 0 {
		return ""
	}
	return SetDigest(set)
}

// HistoryDigest is the hex SHA-256 of the JSON of {format, tools, policies} (encoding/json: map
// keys sorted, fields in declaration order, policies left out when there are none): every
// version of every tool and policy.
func (idx *Index) HistoryDigest() (string, error) {
	b, err := json.Marshal(struct {
		Format   string             `json:"format"`
		Tools    map[string][]Entry `json:"tools"`
		Policies map[string][]Entry `json:"policies,omitempty"`
	}{idx.Format, idx.Tools, idx.Policies})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// IndexMessage is what an index signature covers:
// `reversi-registry-index:v2:<id>:<sequence>:<SetDigest of Served>:<HistoryDigest>`, or, when
// the registry serves policies,
// `reversi-registry-index:v3:<id>:<sequence>:<SetDigest of Served>:<PolicyDigest of
// ServedPolicies>:<HistoryDigest>`. The served sets appear by their own digests so that a
// reader holding only the served versions (a gateway) can check that they are exactly the ones
// the writer signed (IndexProof.VerifySet); a reader that drops every policy computes the v2
// message, which the writer did not sign.
func (idx *Index) IndexMessage() ([]byte, error) {
	history, err := idx.HistoryDigest()
	if err != nil {
		return nil, err
	}
	return indexMessage(idx.ID, idx.Sequence, SetDigest(idx.Served()), PolicyDigest(idx.ServedPolicies()), history), nil
}

func indexMessage(id string, sequence int64, served, policies, history string) []byte {
	if policies == "" {
		return []byte("reversi-registry-index:v2:" + id + ":" + strconv.FormatInt(sequence, 10) + ":" + served + ":" + history)
	}
	return []byte("reversi-registry-index:v3:" + id + ":" + strconv.FormatInt(sequence, 10) + ":" + served + ":" + policies + ":" + history)
}

// newRegistryID is a registry's random id: 32 hex characters.
func newRegistryID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return hex.EncodeToString(b[:])
}

// IndexProof is what a reader that holds only the served versions needs to check the index
// signature: the sequence, the history digest and the signature. Snapshots carry it (JSON field
// names as in index.json).
type IndexProof struct {
	ID        string `json:"id"`
	Sequence  int64  `json:"sequence"`
	History   string `json:"history"`
	KeyID     string `json:"key_id"`
	Signature string `json:"signature"`
}

// Proof is the index's IndexProof (empty KeyID and Signature when it is unsigned).
func (idx *Index) Proof() (IndexProof, error) {
	history, err := idx.HistoryDigest()
	if err != nil {
		return IndexProof{}, err
	}
	return IndexProof{ID: idx.ID, Sequence: idx.Sequence, History: history, KeyID: idx.KeyID, Signature: idx.Signature}, nil
}

// Verify checks that a writer trusted by trust signed an index whose served set has the digest
// served (SetDigest), with p's sequence and history. Errors: the proof is unsigned
// (signing.ErrNotSigned) or malformed (signing.ErrMalformedSignature), or the signature does not
// verify (signing.ErrBadSignature; signing.ErrUntrusted when the key is not trusted).
func (p IndexProof) Verify(served string, trust *signing.TrustSet) error {
	return p.VerifySet(served, "", trust)
}

// VerifySet is Verify for a registry that may serve policies: policies is the PolicyDigest of
// the served policies the reader holds ("" for none).
func (p IndexProof) VerifySet(served, policies string, trust *signing.TrustSet) error {
	if p.Signature == "" || p.KeyID == "" {
		return fmt.Errorf("the registry index is %w: the set of served versions cannot be checked; write the registry with --key", signing.ErrNotSigned)
	}
	sig, err := base64.StdEncoding.DecodeString(p.Signature)
	if err != nil {
		return fmt.Errorf("the registry index signature is %w", signing.ErrMalformedSignature)
	}
	if err := trust.Verify(p.KeyID, sig, indexMessage(p.ID, p.Sequence, served, policies, p.History)); err != nil {
		if errors.Is(err, signing.ErrUntrusted) {
			return err
		}
		return fmt.Errorf("%w: these are not the versions the writer signed (an entry was swapped, added or dropped, or the sequence was changed)", err)
	}
	return nil
}

// sign signs the index with s, or clears the signature when s is nil (an unsigned write
// leaves no stale signature behind).
func (idx *Index) sign(s *signing.Signer) error {
	idx.KeyID, idx.Signature = "", ""
	if s == nil {
		return nil
	}
	msg, err := idx.IndexMessage()
	if err != nil {
		return err
	}
	sig, err := s.Sign(msg)
	if err != nil {
		return err
	}
	idx.KeyID, idx.Signature = s.KeyID, base64.StdEncoding.EncodeToString(sig)
	return nil
}

// ErrLegacyIndex is wrapped by loads with trusted keys when index.json has no sequence or id: an
// earlier reversi wrote it, and its signature does not cover what a reader must check. Like the
// signing errors it refuses the index's signature (IsSignatureError).
var ErrLegacyIndex = errors.New("index.json has no sequence or id")

// IsSignatureError reports whether err (or an error it wraps, such as a *Problem) refuses a
// signature: a signing error (signing.IsSignatureError) or ErrLegacyIndex. The controller
// reports these as SignatureVerificationFailed, everything else as ValidationFailed.
func IsSignatureError(err error) bool {
	return signing.IsSignatureError(err) || errors.Is(err, ErrLegacyIndex)
}

// verify checks the index signature against trust (nothing to check without trust). Its errors
// wrap the signing errors or ErrLegacyIndex.
func (idx *Index) verify(trust *signing.TrustSet) error {
	if trust == nil {
		return nil
	}
	if idx.Signature == "" {
		return fmt.Errorf("index.json is %w, but trusted keys are set: the list of versions could be edited unseen; write the registry with --key", signing.ErrNotSigned)
	}
	if idx.Sequence < 1 || idx.ID == "" {
		return fmt.Errorf("%w: it was written by an earlier reversi, whose signature does not cover the served set and the registry's identity; sign it again with reversi manifests sign --key", ErrLegacyIndex)
	}
	sig, err := base64.StdEncoding.DecodeString(idx.Signature)
	if err != nil {
		return fmt.Errorf("index.json's signature is %w", signing.ErrMalformedSignature)
	}
	msg, err := idx.IndexMessage()
	if err != nil {
		return err
	}
	if err := trust.Verify(idx.KeyID, sig, msg); err != nil {
		if errors.Is(err, signing.ErrUntrusted) {
			return err
		}
		return fmt.Errorf("%w: the list of versions (or their authors and approvers) was edited after it was signed; restore it", err)
	}
	return nil
}

// VersionFile is tools/<tool>/v<N>.json: the entry, the tool, and the normalised manifest
// (its canonical JSON, so the checksum can be recomputed from the file alone).
type VersionFile struct {
	Tool string `json:"tool"`
	Entry
	Manifest json.RawMessage `json:"manifest"`
}

// Registry is a registry folder.
type Registry struct {
	// Dir is the registry folder (for NewFS, the name used in messages).
	Dir string
	// fsys, when set, is where the registry is read from (read-only).
	fsys fs.FS
}

// New returns the registry at dir. The folder need not exist yet (publish creates it).
func New(dir string) *Registry { return &Registry{Dir: dir} }

// NewFS returns a read-only registry held in fsys (e.g. a git commit's files, read from the
// objects); name is what messages call it. Writers refuse it.
func NewFS(name string, fsys fs.FS) *Registry { return &Registry{Dir: name, fsys: fsys} }

// IsRegistry reports whether dir holds a registry (an index.json).
func IsRegistry(dir string) bool {
	fi, err := os.Stat(filepath.Join(dir, IndexFile))
	return err == nil && fi.Mode().IsRegular()
}

// IsRegistryFS reports whether fsys holds a registry at its root.
func IsRegistryFS(fsys fs.FS) bool {
	fi, err := fs.Stat(fsys, IndexFile)
	return err == nil && fi.Mode().IsRegular()
}

// toolDir is the tool's folder, relative to the registry: `tools/<escaped tool>`. Tool names
// may hold `/` and `.`, so the name is escaped into one path element, and `.`/`..` (which
// would escape the tool folder) are refused.
func toolDir(tool string) (string, error) {
	if tool == "" {
		return "", errors.New("empty tool name")
	}
	el := url.PathEscape(tool)
	if el == "." || el == ".." {
		return "", fmt.Errorf("tool name %q cannot be a folder name", tool)
	}
	return path.Join("tools", el), nil
}

// versionPath is the version file's path, relative to the registry.
func versionPath(tool string, version int) (string, error) {
	dir, err := toolDir(tool)
	if err != nil {
		return "", err
	}
	return path.Join(dir, "v"+strconv.Itoa(version)+".json"), nil
}

// readIndex reads index.json strictly. A missing index is an empty registry only for a
// writer about to create it; readers get an error (a registry never loads as empty by
// accident).
func (r *Registry) readIndex(creating bool) (*Index, error) {
	var data []byte
	var err error
	if r.fsys != nil {
		data, err = fs.ReadFile(r.fsys, IndexFile)
	} else {
		data, err = os.ReadFile(filepath.Join(r.Dir, IndexFile))
	}
	if errors.Is(err, fs.ErrNotExist) {
		if creating {
			return &Index{Format: Format, ID: newRegistryID(), Tools: map[string][]Entry{}, Policies: map[string][]Entry{}}, nil
		}
		return nil, fmt.Errorf("%s is not a registry: it has no %s (publish with reversi manifests publish)", r.Dir, IndexFile)
	}
	if err != nil {
		return nil, err
	}
	var idx Index
	if err := strictJSON(data, &idx); err != nil {
		return nil, fmt.Errorf("%s: %w: restore it from version control", filepath.Join(r.Dir, IndexFile), err)
	}
	if idx.Format != Format {
		return nil, fmt.Errorf("%s: format %q, want %q", filepath.Join(r.Dir, IndexFile), idx.Format, Format)
	}
	if idx.Tools == nil {
		idx.Tools = map[string][]Entry{}
	}
	if idx.Policies == nil {
		idx.Policies = map[string][]Entry{}
	}
	return &idx, nil
}

// strictJSON decodes one JSON value, refusing unknown fields and trailing data.
func strictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("not valid registry JSON: %w", err)
	}
	if dec.More() {
		return errors.New("not valid registry JSON: data after the top-level value")
	}
	return nil
}

// Tools lists the tool names of an index, sorted.
func (idx *Index) tools() []string {
	names := make([]string, 0, len(idx.Tools))
	for t := range idx.Tools {
		names = append(names, t)
	}
	sort.Strings(names)
	return names
}

// History returns the entries of a tool, oldest first, as index.json records them.
func (r *Registry) History(tool string) ([]Entry, error) {
	idx, err := r.readIndex(false)
	if err != nil {
		return nil, err
	}
	es, ok := idx.Tools[tool]
	if !ok {
		return nil, fmt.Errorf("%s is not in the registry %s", tool, r.Dir)
	}
	return es, nil
}

// Tools lists the registry's tools, sorted.
func (r *Registry) Tools() ([]string, error) {
	idx, err := r.readIndex(false)
	if err != nil {
		return nil, err
	}
	return idx.tools(), nil
}

// PlainTrustError is trusted manifest keys set for manifests that are not in a registry:
// plain manifest files carry no signatures, so the keys would check nothing while looking as
// if they did (seed: "Setting it for manifests that are not in a registry is an error"). The
// CLI (validate, lint, test, gateway --manifests …), LoadPath and the controller (a
// ManifestRegistry with format: Plain and spec.verify.manifestKeysSecretRef) report this one
// error.
type PlainTrustError struct {
	// Manifests names what was loaded: a path, or a ManifestRegistry and its spec.path.
	Manifests string
	// Setting names where the keys are set, and so what to unset: manifest_public_key in a
	// config file, $REVERSI_MANIFEST_PUBLIC_KEY, spec.verify.manifestKeysSecretRef.
	Setting string
}

func (e *PlainTrustError) Error() string {
	return fmt.Sprintf("%s is not a registry, but trusted manifest keys are set (%s): plain manifest files carry no signatures to check; publish them to a signed registry (reversi manifests publish --key), or unset %s",
		e.Manifests, e.Setting, e.Setting)
}

// LoadPath loads the manifests `manifests:` names: a registry folder (with index.json) is
// loaded with every check and trust (the project's manifest_public_key); plain manifest files
// are read and validated. Trusted keys set for plain files are a *PlainTrustError.
func LoadPath(p string, trust *signing.TrustSet) ([]*manifest.Manifest, []error) {
	if IsRegistry(p) {
		snap, errs := New(p).Load(trust)
		if len(errs) > 0 {
			return nil, errs
		}
		return snap.Manifests, nil
	}
	if trust != nil {
		return nil, []error{&PlainTrustError{Manifests: p, Setting: "manifest_public_key"}}
	}
	docs, errs := manifest.ReadPaths(p)
	ms, verrs := manifest.ValidateDocuments(docs)
	errs = append(errs, verrs...)
	manifest.SortErrors(errs)
	if len(errs) > 0 {
		return nil, errs
	}
	return ms, nil
}
