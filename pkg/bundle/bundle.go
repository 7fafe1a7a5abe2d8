// Package bundle is the form verified manifests take between the controller and the gateway:
// the entries of one or more sources (each version's entry and canonical manifest bytes, with
// its writer signature) and, per source, a snapshot signed by the controller saying which
// entries the source serves at which revision and sequence; split into ConfigMap-sized shards.
// The controller renders bundles; gateway pods assemble the shards and verify every entry and
// every snapshot again before enforcing anything (DESIGN.md "Trust model", issue 15).
package bundle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// ConfigMap data keys of a shard. Nothing unsigned is read as a fact: the digest and the shard
// numbers only let a reader assemble the shards of one rendering; what is served and from which
// revision comes from the entries and the signed snapshots.
const (
	KeyDigest    = "digest"         // sha256:<hex> of the bundle's tool@version:checksum lines
	KeyShard     = "shard"          // this shard's index, from 0
	KeyShards    = "shards"         // how many shards the bundle has
	KeyManifests = "manifests.json" // a JSON array of Entry
	// KeySnapshots is a JSON array of SignedSnapshot, in shard 0 only.
	KeySnapshots = "snapshots.json"
	// KeyPolicies is a JSON array of PolicyEntry, in shard 0 only, and only when the bundle
	// has policies (a rendering without policies keeps its earlier bytes; a gateway that
	// predates policies refuses a rendering with them as an unknown key: it fails closed).
	KeyPolicies = "policies.json"
)

// MaxShardBytes is the default budget of one shard's data: the API server caps a ConfigMap at
// 1 MiB, and the object's metadata needs room too.
const MaxShardBytes = 900 * 1024

// Entry is one loaded version: its registry entry, the tool, the source it comes from (a
// Snapshot's Source), and the manifest's canonical JSON (the bytes its checksum and signature
// cover).
type Entry struct {
	Tool   string `json:"tool"`
	Source string `json:"source,omitempty"`
	registry.Entry
	Manifest json.RawMessage `json:"manifest"`
}

// PolicyEntry is one loaded policy version: its registry entry, the policy's name, the source
// it comes from, and the policy's canonical JSON (the bytes its checksum and signature cover).
type PolicyEntry struct {
	Policy string `json:"policy"`
	Source string `json:"source,omitempty"`
	registry.Entry
	Document json.RawMessage `json:"document"`
}

// Bundle is the verified manifests and policies of one or more sources, with each source's
// signed snapshot.
type Bundle struct {
	Entries   []Entry // sorted by tool
	Snapshots []SignedSnapshot
	Policies  []PolicyEntry // sorted by name
}

// FromSnapshot builds the (not yet attested) bundle of a loaded registry snapshot; every entry
// names source.
func FromSnapshot(source string, s *registry.Snapshot) Bundle {
	var b Bundle
	for _, m := range s.Manifests {
		b.Entries = append(b.Entries, Entry{Tool: m.Tool, Source: source, Entry: s.Entries[m.Tool], Manifest: s.Canonical[m.Tool]})
	}
	for _, p := range s.Policies {
		b.Policies = append(b.Policies, PolicyEntry{Policy: p.Name, Source: source, Entry: s.PolicyEntries[p.Name], Document: s.PolicyCanonical[p.Name]})
	}
	sortEntries(b.Entries)
	sortPolicies(b.Policies)
	return b
}

// AddPolicies adds plain (unsigned) policies of source to b: each entry's checksum is computed
// here, as version 1, approved (a Plain registry's policy files are what its commit says).
func (b *Bundle) AddPolicies(source string, ps []*apipolicy.Policy) error {
	for _, p := range ps {
		canonical, err := apipolicy.CanonicalJSON(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(canonical)
		b.Policies = append(b.Policies, PolicyEntry{Policy: p.Name, Source: source, Document: canonical, Entry: registry.Entry{
			Version: 1, Status: manifest.Approved, Checksum: hex.EncodeToString(sum[:]),
		}})
	}
	sortPolicies(b.Policies)
	return nil
}

func sortPolicies(ps []PolicyEntry) {
	sort.SliceStable(ps, func(i, j int) bool {
		if ps[i].Policy != ps[j].Policy {
			return ps[i].Policy < ps[j].Policy
		}
		return ps[i].Source < ps[j].Source
	})
}

// PolicyDigest is registry.PolicyDigest of the bundle's policies ("" for none).
func (b Bundle) PolicyDigest() string { return policyDigestOf(b.Policies, nil) }

// SourcePolicyDigest is the policy digest of the policies of one source ("" for none).
func (b Bundle) SourcePolicyDigest(source string) string {
	return policyDigestOf(b.Policies, func(p PolicyEntry) bool { return p.Source == source })
}

func policyDigestOf(ps []PolicyEntry, keep func(PolicyEntry) bool) string {
	set := map[string]registry.Entry{}
	for _, p := range ps {
		if keep == nil || keep(p) {
			set[p.Policy] = p.Entry
		}
	}
	return registry.PolicyDigest(set)
}

// PolicyNames are the names of the bundle's policies, sorted.
func (b Bundle) PolicyNames() []string {
	var out []string
	for _, p := range b.Policies {
		out = append(out, p.Policy)
	}
	return out
}

// FromManifests builds the bundle of plain (unsigned) manifests: each entry's checksum is
// computed here and the version and status are the manifest's own. Drafts are kept: the
// gateway blocks their calls as drafts.
func FromManifests(source string, ms []*manifest.Manifest) (Bundle, error) {
	var b Bundle
	for _, m := range ms {
		canonical, err := manifest.CanonicalJSON(m)
		if err != nil {
			return Bundle{}, err
		}
		sum := sha256.Sum256(canonical)
		b.Entries = append(b.Entries, Entry{Tool: m.Tool, Source: source, Manifest: canonical, Entry: registry.Entry{
			Version: m.Version, Status: m.Status, Checksum: hex.EncodeToString(sum[:]),
		}})
	}
	sortEntries(b.Entries)
	return b, nil
}

func sortEntries(es []Entry) {
	sort.SliceStable(es, func(i, j int) bool {
		if es[i].Tool != es[j].Tool {
			return es[i].Tool < es[j].Tool
		}
		return es[i].Source < es[j].Source
	})
}

// Merge joins bundles (their entries and snapshots). Tools defined twice stay twice: Verify
// refuses them, and the ReversiGateway controller names both sources before merging.
func Merge(bs ...Bundle) Bundle {
	var out Bundle
	for _, b := range bs {
		out.Entries = append(out.Entries, b.Entries...)
		out.Snapshots = append(out.Snapshots, b.Snapshots...)
		out.Policies = append(out.Policies, b.Policies...)
	}
	sortEntries(out.Entries)
	sortPolicies(out.Policies)
	return out
}

// Digest is registry.SetDigest of the entries: equal digests mean the same enforced
// manifests, whatever the revision.
func (b Bundle) Digest() string { return digestOf(b.Entries) }

func digestOf(es []Entry) string {
	set := make(map[string]registry.Entry, len(es))
	for _, e := range es {
		set[e.Tool] = e.Entry
	}
	return registry.SetDigest(set)
}

// SourceDigest is the digest of the entries of one source.
func (b Bundle) SourceDigest(source string) string {
	var es []Entry
	for _, e := range b.Entries {
		if e.Source == source {
			es = append(es, e)
		}
	}
	return digestOf(es)
}

// Revision names what the bundle serves, from its source snapshots: their Describe, joined by
// ", " ("" without snapshots).
func (b Bundle) Revision() string {
	var parts []string
	for _, s := range b.Snapshots {
		if s.Snapshot.Kind != KindGateway {
			parts = append(parts, s.Snapshot.Describe())
		}
	}
	return strings.Join(parts, ", ")
}

// Shards splits the bundle into ConfigMap data maps of at most maxBytes of manifest JSON each
// (MaxShardBytes when 0). Every shard carries the digest, its index and the count; shard 0 also
// the snapshots. An entry larger than maxBytes on its own is an error.
func (b Bundle) Shards(maxBytes int) ([]map[string]string, error) {
	if maxBytes <= 0 {
		maxBytes = MaxShardBytes
	}
	snaps, err := json.Marshal(b.Snapshots)
	if err != nil {
		return nil, err
	}
	if b.Snapshots == nil {
		snaps = []byte("[]")
	}
	var pols []byte
	if len(b.Policies) > 0 {
		parts := make([][]byte, len(b.Policies))
		for i, p := range b.Policies {
			if parts[i], err = marshal(p); err != nil {
				return nil, err
			}
		}
		pols = append(append([]byte("["), bytes.Join(parts, []byte(","))...), ']')
		if len(snaps)+len(pols)+2 > maxBytes {
			return nil, fmt.Errorf("the policies are %d bytes, more than shard 0 holds with the snapshots (%d)", len(pols), maxBytes)
		}
	}
	var groups [][][]byte
	var cur [][]byte
	size := 2 + len(snaps) + len(pols) // the brackets of the array; shard 0 holds the snapshots and policies too
	for _, e := range b.Entries {
		raw, err := marshal(e)
		if err != nil {
			return nil, err
		}
		if len(raw)+2 > maxBytes {
			return nil, fmt.Errorf("%s v%d is %d bytes, more than a shard holds (%d)", e.Tool, e.Version, len(raw), maxBytes)
		}
		if len(cur) > 0 && size+1+len(raw) > maxBytes {
			groups, cur, size = append(groups, cur), nil, 2
		}
		cur = append(cur, raw)
		size += len(raw) + 1
	}
	groups = append(groups, cur) // an empty bundle is one empty shard
	digest := b.Digest()
	out := make([]map[string]string, len(groups))
	for i, g := range groups {
		out[i] = map[string]string{
			KeyDigest:    digest,
			KeyShard:     strconv.Itoa(i),
			KeyShards:    strconv.Itoa(len(groups)),
			KeyManifests: "[" + string(bytes.Join(g, []byte(","))) + "]",
		}
	}
	out[0][KeySnapshots] = string(snaps)
	if pols != nil {
		out[0][KeyPolicies] = string(pols)
	}
	return out, nil
}

// marshal writes an entry without HTML escaping, so the manifest stays its canonical bytes.
func marshal(e any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(e); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// strict decodes one JSON value, refusing unknown fields and trailing data.
func strict(data string, v any) error {
	dec := json.NewDecoder(strings.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("data after the JSON value")
	}
	return nil
}

// Assemble joins the shards of one bundle (in any order). It refuses a set that is not one
// complete bundle: a missing or repeated shard, shards of different renderings, an unknown data
// key, or a digest that does not match the entries. It checks no signature: see Verify.
func Assemble(shards []map[string]string) (Bundle, error) {
	if len(shards) == 0 {
		return Bundle{}, errors.New("no shards")
	}
	first := shards[0]
	n, err := strconv.Atoi(first[KeyShards])
	if err != nil || n < 1 {
		return Bundle{}, fmt.Errorf("shard count %q is not a positive number", first[KeyShards])
	}
	if len(shards) != n {
		return Bundle{}, fmt.Errorf("have %d of %d shards: the rendering is incomplete", len(shards), n)
	}
	var b Bundle
	seen := make([]bool, n)
	for _, s := range shards {
		i, err := strconv.Atoi(s[KeyShard])
		if err != nil || i < 0 || i >= n || seen[i] {
			return Bundle{}, fmt.Errorf("shard index %q is out of range or repeated", s[KeyShard])
		}
		seen[i] = true
		if s[KeyDigest] != first[KeyDigest] || s[KeyShards] != first[KeyShards] {
			return Bundle{}, errors.New("shards of different renderings are mixed: wait for the controller to finish")
		}
		for k := range s {
			switch k {
			case KeyDigest, KeyShard, KeyShards, KeyManifests:
			case KeySnapshots, KeyPolicies:
				if i != 0 {
					return Bundle{}, fmt.Errorf("shard %d holds %s, which only shard 0 may: the rendering was edited", i, k)
				}
			default:
				return Bundle{}, fmt.Errorf("shard %d has the unknown key %q: the rendering was edited (nothing unsigned is read)", i, k)
			}
		}
		var es []Entry
		if err := strict(s[KeyManifests], &es); err != nil {
			return Bundle{}, fmt.Errorf("shard %d: %s is not valid: %v", i, KeyManifests, err)
		}
		b.Entries = append(b.Entries, es...)
		if i == 0 {
			if raw, ok := s[KeySnapshots]; ok {
				if err := strict(raw, &b.Snapshots); err != nil {
					return Bundle{}, fmt.Errorf("shard 0: %s is not valid: %v", KeySnapshots, err)
				}
			}
			if raw, ok := s[KeyPolicies]; ok {
				if err := strict(raw, &b.Policies); err != nil {
					return Bundle{}, fmt.Errorf("shard 0: %s is not valid: %v", KeyPolicies, err)
				}
			}
		}
	}
	sortEntries(b.Entries)
	sortPolicies(b.Policies)
	if d := b.Digest(); d != first[KeyDigest] {
		return Bundle{}, fmt.Errorf("the entries' digest is %s, the recorded one %s: the rendering was edited", d, first[KeyDigest])
	}
	return b, nil
}

// Verify checks a bundle before anything in it is enforced, and returns its manifests only when
// every check passes, else every problem:
//   - each entry as a registry load does (checksum over the manifest bytes, manifest valid and
//     matching its entry; with writers, a signature by a writer key);
//   - with controller keys, the set: every snapshot is signed by the controller, names its
//     source once, and its digest is that of exactly the entries of its source; every entry
//     belongs to a snapshot's source. With writers too, a Registry snapshot's index proof must
//     verify (the entries are exactly the served versions the writer signed), and an entry
//     without a writer signature is accepted only from a Plain source;
//   - the set as a whole (cross-manifest rules).
//
// Without controller keys the snapshots are not checked (a rendering for a gateway that
// verifies no signatures at all); the gateway requires them whenever writers are set.
func (b Bundle) Verify(writers, controller *signing.TrustSet) ([]*manifest.Manifest, []error) {
	v, errs := b.VerifyAll(writers, controller)
	return v.Manifests, errs
}

// Verified is what a verified bundle serves.
type Verified struct {
	Manifests []*manifest.Manifest
	// Policies are the verified policies, sorted by name (VerifyGatewayAll: those the gateway
	// snapshot selects).
	Policies []*apipolicy.Policy
}

// VerifyAll is Verify that also verifies the bundle's policies as it does the manifests, and
// returns them: each policy entry's checksum over its document, the document a valid policy of
// the entry's name that compiles, an approved (never a draft) version and, with writers, a
// writer's signature over signing.PolicyMessage (Plain sources: none, the controller's snapshot
// vouches); with controller keys every source snapshot's policy digest is that of exactly its
// policies, and a Registry snapshot's index proof covers them (IndexProof.VerifySet), so a
// policy dropped, added, swapped or edited is refused.
func (b Bundle) VerifyAll(writers, controller *signing.TrustSet) (Verified, []error) {
	var errs []error
	kinds := map[string]string{} // source -> kind of its verified snapshot
	if controller != nil {
		for _, ss := range b.Snapshots {
			s := ss.Snapshot
			if err := ss.Verify(controller); err != nil {
				errs = append(errs, err)
				continue
			}
			if _, dup := kinds[s.Source]; dup {
				errs = append(errs, fmt.Errorf("snapshot of %s: listed twice", s.Source))
				continue
			}
			kinds[s.Source] = s.Kind
			if s.Kind == KindGateway {
				continue // over all the entries: VerifyGateway checks it
			}
			if d := b.SourceDigest(s.Source); d != s.Digest {
				errs = append(errs, fmt.Errorf("snapshot of %s: its entries' digest is %s, the signed one %s: entries were swapped, added or dropped", s.Source, d, s.Digest))
			}
			if d := b.SourcePolicyDigest(s.Source); d != s.Policies {
				errs = append(errs, fmt.Errorf("snapshot of %s: its policies' digest is %s, the signed one %s: policies were swapped, added or dropped", s.Source, orNone(d), orNone(s.Policies)))
			}
			if s.Kind == KindRegistry && writers != nil {
				if err := s.Index.VerifySet(s.Digest, s.Policies, writers); err != nil {
					errs = append(errs, fmt.Errorf("snapshot of %s: %w", s.Source, err))
				}
			}
		}
	}
	var ms []*manifest.Manifest
	seen := map[string]bool{}
	for _, e := range b.Entries {
		if seen[e.Tool] {
			errs = append(errs, fmt.Errorf("%s: listed twice", e.Tool))
			continue
		}
		seen[e.Tool] = true
		trust := writers
		if controller != nil {
			kind, ok := kinds[e.Source]
			if !ok || kind == KindGateway {
				errs = append(errs, fmt.Errorf("%s v%d: its source %q has no verified snapshot: the entry was added to the rendering", e.Tool, e.Version, e.Source))
				continue
			}
			if kind == KindPlain {
				trust = nil // plain files carry no writer signature: the controller's snapshot vouches for the set
			}
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, e.Manifest); err != nil {
			errs = append(errs, fmt.Errorf("%s v%d: the manifest is not JSON: %v", e.Tool, e.Version, err))
			continue
		}
		m, err := registry.VerifyEntry(e.Tool, e.Entry, compact.Bytes(), trust, false)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s v%d: %w", e.Tool, e.Version, err))
			continue
		}
		ms = append(ms, m)
	}
	errs = append(errs, manifest.ValidateSet(ms)...)
	var ps []*apipolicy.Policy
	seenPolicy := map[string]bool{}
	for _, e := range b.Policies {
		if seenPolicy[e.Policy] {
			errs = append(errs, fmt.Errorf("policy %s: listed twice (by more than one source)", e.Policy))
			continue
		}
		seenPolicy[e.Policy] = true
		trust := writers
		if controller != nil {
			kind, ok := kinds[e.Source]
			if !ok || kind == KindGateway || kind == KindToolManifests {
				errs = append(errs, fmt.Errorf("policy %s v%d: its source %q has no verified snapshot: the policy was added to the rendering", e.Policy, e.Version, e.Source))
				continue
			}
			if kind == KindPlain {
				trust = nil
			}
		}
		if e.Status == manifest.Draft {
			errs = append(errs, fmt.Errorf("policy %s v%d is a draft: drafts are never served; the rendering was edited", e.Policy, e.Version))
			continue
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, e.Document); err != nil {
			errs = append(errs, fmt.Errorf("policy %s v%d: the policy is not JSON: %v", e.Policy, e.Version, err))
			continue
		}
		p, err := registry.VerifyPolicyEntry(e.Policy, e.Entry, compact.Bytes(), trust, false)
		if err != nil {
			errs = append(errs, fmt.Errorf("policy %s v%d: %w", e.Policy, e.Version, err))
			continue
		}
		ps = append(ps, p)
	}
	if len(errs) > 0 {
		return Verified{}, errs
	}
	return Verified{Manifests: ms, Policies: ps}, nil
}

func orNone(d string) string {
	if d == "" {
		return "(none)"
	}
	return d
}

// MaxFutureSequence is how far (in ms) a snapshot's sequence may lie ahead of the reader's
// clock: the controller takes sequences from its clock, so one far ahead was forged or made
// by a broken clock, and accepting it would freeze every later snapshot as older.
const MaxFutureSequence = int64(24 * time.Hour / time.Millisecond)

// VerifyGateway is Verify for the gateway pod named gateway (GatewaySource): besides every
// check of Verify (with controller keys, which it requires) the rendering must carry exactly
// one gateway snapshot, of that gateway, whose digest is that of all the entries and whose
// sources are exactly the other snapshots' (another source's or another gateway's signed
// rendering cannot stand in); with writers, a Plain source must be one the gateway snapshot
// accepts unsigned; and no sequence may lie more than MaxFutureSequence past now.
func (b Bundle) VerifyGateway(gateway string, writers, controller *signing.TrustSet, now time.Time) ([]*manifest.Manifest, []error) {
	v, errs := b.VerifyGatewayAll(gateway, writers, controller, now)
	return v.Manifests, errs
}

// VerifyGatewayAll is VerifyGateway that also returns the policies the gateway enforces: the
// gateway snapshot's policy digest must be that of all the rendering's policies, and it names
// (PolicyNames) which of them this gateway enforces (ReversiGateway spec.policies); a named
// policy missing from the rendering is refused.
func (b Bundle) VerifyGatewayAll(gateway string, writers, controller *signing.TrustSet, now time.Time) (Verified, []error) {
	if controller == nil {
		return Verified{}, []error{errors.New("the controller's keys are needed to verify a gateway's rendering")}
	}
	v, errs := b.VerifyAll(writers, controller)
	var gw []Snapshot
	plain := map[string]Snapshot{}
	limit := now.UnixMilli() + MaxFutureSequence
	for _, ss := range b.Snapshots {
		s := ss.Snapshot
		if s.Sequence > limit {
			errs = append(errs, fmt.Errorf("snapshot of %s: sequence %d lies in the future (after %d): it was not made by the controller's clock; refused, since it would make every later snapshot look older", s.Source, s.Sequence, limit))
		}
		switch s.Kind {
		case KindGateway:
			gw = append(gw, s)
		case KindPlain:
			plain[s.Source] = s
		}
	}
	switch {
	case len(gw) != 1:
		errs = append(errs, fmt.Errorf("the rendering has %d gateway snapshots, want one of %s: it is not this gateway's rendering", len(gw), gateway))
	case gw[0].Source != gateway:
		errs = append(errs, fmt.Errorf("the rendering is %s's, not %s's: another gateway's rendering was put in its place", gw[0].Source, gateway))
	default:
		g := gw[0]
		if d := b.Digest(); d != g.Digest {
			errs = append(errs, fmt.Errorf("snapshot of %s: the entries' digest is %s, the signed one %s", g.Source, d, g.Digest))
		}
		if got := b.Sources(); !slices.Equal(got, g.Sources) {
			errs = append(errs, fmt.Errorf("snapshot of %s: the rendering holds the sources %v, the signed ones are %v: another source's rendering was put in its place", g.Source, got, g.Sources))
		}
		if d := b.PolicyDigest(); d != g.Policies {
			errs = append(errs, fmt.Errorf("snapshot of %s: the policies' digest is %s, the signed one %s: policies were swapped, added or dropped", g.Source, orNone(d), orNone(g.Policies)))
		}
		byName := map[string]*apipolicy.Policy{}
		for _, p := range v.Policies {
			byName[p.Name] = p
		}
		var selected []*apipolicy.Policy
		for _, name := range g.PolicyNames {
			p, ok := byName[name]
			if !ok {
				errs = append(errs, fmt.Errorf("snapshot of %s: it enforces policy %s, which the rendering lacks: the policy was dropped", g.Source, name))
				continue
			}
			selected = append(selected, p)
		}
		v.Policies = selected
		if writers != nil {
			for src, p := range plain {
				switch {
				case !slices.Contains(g.Unsigned, src):
					errs = append(errs, fmt.Errorf("%s is format Plain (no writer signatures), and this gateway does not accept it unsigned (ReversiGateway spec.manifests.plainRegistries)", src))
				case p.CommitSigner == "":
					errs = append(errs, fmt.Errorf("%s is format Plain and its commit was not verified: without writer signatures, a signed commit is what vouches for its manifests (ManifestRegistry spec.verify.commit)", src))
				}
			}
		}
	}
	if len(errs) > 0 {
		return Verified{}, errs
	}
	return v, nil
}
