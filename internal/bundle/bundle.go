// Package bundle is the form verified manifests take between the controller and the gateway:
// the entries of a registry revision (each version's entry and canonical manifest bytes, with
// its signature), split into ConfigMap-sized shards. The controller renders bundles; gateway
// pods assemble the shards and verify every entry again before enforcing anything.
package bundle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/internal/registry"
	"github.com/reversi-gitops/reversi/internal/signing"
)

// ConfigMap data keys of a shard.
const (
	KeyRevision  = "revision"       // the source revision, e.g. main@sha1:<40 hex>
	KeyDigest    = "digest"         // sha256:<hex> of the bundle's tool@version:checksum lines
	KeyShard     = "shard"          // this shard's index, from 0
	KeyShards    = "shards"         // how many shards the bundle has
	KeyManifests = "manifests.json" // a JSON array of Entry
)

// MaxShardBytes is the default budget of one shard's data: the API server caps a ConfigMap at
// 1 MiB, and the object's metadata needs room too.
const MaxShardBytes = 900 * 1024

// Entry is one loaded version: its registry entry, the tool, and the manifest's canonical
// JSON (the bytes its checksum and signature cover).
type Entry struct {
	Tool string `json:"tool"`
	registry.Entry
	Manifest json.RawMessage `json:"manifest"`
}

// Bundle is the verified manifests of one source revision.
type Bundle struct {
	Revision string
	Entries  []Entry // sorted by tool
}

// FromSnapshot builds the bundle of a loaded registry snapshot.
func FromSnapshot(revision string, s *registry.Snapshot) Bundle {
	b := Bundle{Revision: revision}
	for _, m := range s.Manifests {
		b.Entries = append(b.Entries, Entry{Tool: m.Tool, Entry: s.Entries[m.Tool], Manifest: s.Canonical[m.Tool]})
	}
	sort.Slice(b.Entries, func(i, j int) bool { return b.Entries[i].Tool < b.Entries[j].Tool })
	return b
}

// FromManifests builds the bundle of plain (unsigned) manifests: each entry's checksum is
// computed here and the version and status are the manifest's own. Drafts are kept: the
// gateway blocks their calls as drafts.
func FromManifests(revision string, ms []*manifest.Manifest) (Bundle, error) {
	b := Bundle{Revision: revision}
	for _, m := range ms {
		canonical, err := manifest.CanonicalJSON(m)
		if err != nil {
			return Bundle{}, err
		}
		sum := sha256.Sum256(canonical)
		b.Entries = append(b.Entries, Entry{Tool: m.Tool, Manifest: canonical, Entry: registry.Entry{
			Version: m.Version, Status: m.Status, Checksum: hex.EncodeToString(sum[:]),
		}})
	}
	sort.Slice(b.Entries, func(i, j int) bool { return b.Entries[i].Tool < b.Entries[j].Tool })
	return b, nil
}

// Digest is `sha256:<hex>` over the sorted `tool@version:checksum` lines: equal digests mean
// the same enforced manifests, whatever the revision.
func (b Bundle) Digest() string {
	h := sha256.New()
	for _, e := range b.Entries {
		fmt.Fprintf(h, "%s@%d:%s\n", e.Tool, e.Version, e.Checksum)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// Shards splits the bundle into ConfigMap data maps of at most maxBytes of manifest JSON each
// (MaxShardBytes when 0). Every shard carries the revision, digest, its index and the count.
// An entry larger than maxBytes on its own is an error.
func (b Bundle) Shards(maxBytes int) ([]map[string]string, error) {
	if maxBytes <= 0 {
		maxBytes = MaxShardBytes
	}
	var groups [][][]byte
	var cur [][]byte
	size := 2 // the brackets of the array
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
			KeyRevision:  b.Revision,
			KeyDigest:    digest,
			KeyShard:     strconv.Itoa(i),
			KeyShards:    strconv.Itoa(len(groups)),
			KeyManifests: "[" + string(bytes.Join(g, []byte(","))) + "]",
		}
	}
	return out, nil
}

// marshal writes an entry without HTML escaping, so the manifest stays its canonical bytes.
func marshal(e Entry) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(e); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// Assemble joins the shards of one bundle (in any order). It refuses a set that is not one
// complete bundle: a missing or repeated shard, shards of different revisions or digests, or
// a digest that does not match the entries.
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
	b := Bundle{Revision: first[KeyRevision]}
	seen := make([]bool, n)
	for _, s := range shards {
		i, err := strconv.Atoi(s[KeyShard])
		if err != nil || i < 0 || i >= n || seen[i] {
			return Bundle{}, fmt.Errorf("shard index %q is out of range or repeated", s[KeyShard])
		}
		seen[i] = true
		if s[KeyRevision] != b.Revision || s[KeyDigest] != first[KeyDigest] || s[KeyShards] != first[KeyShards] {
			return Bundle{}, errors.New("shards of different renderings are mixed: wait for the controller to finish")
		}
		var es []Entry
		dec := json.NewDecoder(bytes.NewReader([]byte(s[KeyManifests])))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&es); err != nil {
			return Bundle{}, fmt.Errorf("shard %d: %s is not valid: %v", i, KeyManifests, err)
		}
		b.Entries = append(b.Entries, es...)
	}
	sort.Slice(b.Entries, func(i, j int) bool { return b.Entries[i].Tool < b.Entries[j].Tool })
	if d := b.Digest(); d != first[KeyDigest] {
		return Bundle{}, fmt.Errorf("the entries' digest is %s, the recorded one %s: the rendering was edited", d, first[KeyDigest])
	}
	return b, nil
}

// Verify checks every entry as a registry load does (checksum over the manifest bytes,
// manifest valid and matching its entry, and with trust a signature by a trusted key; an
// unsigned entry fails when trust is set), then the set as a whole. It returns the manifests
// only when everything passes, else every problem.
func (b Bundle) Verify(trust *signing.TrustSet) ([]*manifest.Manifest, []error) {
	var ms []*manifest.Manifest
	var errs []error
	seen := map[string]bool{}
	for _, e := range b.Entries {
		if seen[e.Tool] {
			errs = append(errs, fmt.Errorf("%s: listed twice", e.Tool))
			continue
		}
		seen[e.Tool] = true
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
	if len(errs) > 0 {
		return nil, errs
	}
	return ms, nil
}
