package bundle

import (
	"cmp"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// SnapshotFormat is the `format` of a Snapshot.
const SnapshotFormat = "reversi.dev/snapshot/v1"

// Kinds of source a snapshot describes.
const (
	// KindRegistry is a ManifestRegistry with format Registry: every version and the index are
	// signed by a writer, and the snapshot carries the index's proof.
	KindRegistry = "Registry"
	// KindPlain is a ManifestRegistry with format Plain: the versions are not signed by a
	// writer; the controller verified the commit and signs the set.
	KindPlain = "Plain"
	// KindToolManifests is a gateway's selected ToolManifests: each is signed by a writer, and
	// the controller signs which of them make the set.
	KindToolManifests = "ToolManifests"
	// KindGateway is one gateway's whole rendering: which sources make it up (so another
	// source's signed rendering cannot stand in for them) and the digest of all its entries.
	KindGateway = "Gateway"
)

// Snapshot is the controller's statement of which manifest versions one source serves at
// one revision (TUF: snapshot metadata). It is signed (SignedSnapshot) by the controller's
// own key; gateways enforce only entries a snapshot they verified lists, and never an older
// snapshot of a source than one they served (Sequence, a high-water mark in their store).
type Snapshot struct {
	Format string `json:"format"`
	// Source names the source: "ManifestRegistry <namespace>/<name>" or
	// "ToolManifests <namespace>/<gateway>".
	Source string `json:"source"`
	Kind   string `json:"kind"`
	// Revision is the source revision, e.g. main@sha1:<40 hex> (empty for ToolManifests).
	Revision string `json:"revision,omitempty"`
	// Sequence only grows from one snapshot of a source to the next (the controller takes
	// the larger of the last one plus one and the time in Unix milliseconds).
	Sequence int64 `json:"sequence"`
	// Digest is registry.SetDigest of this source's entries.
	Digest string `json:"digest"`
	// CommitSigner is the fingerprint of the key that signed the commit or tag, when the
	// registry verifies commits.
	CommitSigner string `json:"commit_signer,omitempty"`
	// AcceptedRevision is the revision the latest override annotation made the controller
	// accept (although it did not descend from the one applied before, or its index was older
	// or another registry's); every later snapshot of the source carries it.
	AcceptedRevision string `json:"accepted_revision,omitempty"`
	// Index is the writer's index proof (KindRegistry only).
	Index *registry.IndexProof `json:"index,omitempty"`
	// Sources (KindGateway only) are the sources of the gateway's rendering, sorted; Unsigned
	// those of them of KindPlain that the gateway accepts without writer signatures.
	Sources  []string `json:"sources,omitempty"`
	Unsigned []string `json:"unsigned,omitempty"`
	// Floors (KindToolManifests only) is the highest version of each tool the set ever served,
	// also of tools it serves no more: an older version is left out.
	Floors map[string]int `json:"floors,omitempty"`
	// Policies is registry.PolicyDigest of this source's policies (KindGateway: of all the
	// rendering's policies); "" (absent) for none, so snapshots without policies keep their
	// earlier bytes.
	Policies string `json:"policies,omitempty"`
	// PolicyNames (KindGateway only) are the policies the gateway enforces, sorted
	// (ReversiGateway spec.policies); the rendering's other policies are verified, not enforced.
	PolicyNames []string `json:"policy_names,omitempty"`
}

// SignedSnapshot is a Snapshot with the controller's signature.
type SignedSnapshot struct {
	Snapshot  Snapshot `json:"snapshot"`
	KeyID     string   `json:"key_id"`
	Signature string   `json:"signature"`
}

// message is what a snapshot signature covers: `reversi-snapshot:<hex SHA-256 of the
// snapshot's JSON>` (encoding/json, fields in declaration order).
func (s Snapshot) message() ([]byte, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	return []byte("reversi-snapshot:" + hex.EncodeToString(sum[:])), nil
}

// Sign signs s with the controller's key. Ed25519 is deterministic: the same snapshot and key
// give the same bytes, so a rendering made again is identical (drift checks compare bytes).
func Sign(s Snapshot, signer *signing.Signer) (SignedSnapshot, error) {
	s.Format = SnapshotFormat
	msg, err := s.message()
	if err != nil {
		return SignedSnapshot{}, err
	}
	sig, err := signer.Sign(msg)
	if err != nil {
		return SignedSnapshot{}, err
	}
	return SignedSnapshot{Snapshot: s, KeyID: signer.KeyID, Signature: base64.StdEncoding.EncodeToString(sig)}, nil
}

// Verify checks the signature against the controller's keys and the snapshot's form.
// Errors name the source; a refused signature wraps signing.ErrMalformedSignature,
// ErrBadSignature, or ErrUntrusted when the key is not a trusted controller key.
func (ss SignedSnapshot) Verify(controller *signing.TrustSet) error {
	s := ss.Snapshot
	if s.Format != SnapshotFormat {
		return fmt.Errorf("snapshot of %s: format %q, want %q", s.Source, s.Format, SnapshotFormat)
	}
	sig, err := base64.StdEncoding.DecodeString(ss.Signature)
	if err != nil || ss.KeyID == "" {
		return fmt.Errorf("snapshot of %s: the signature or key id is %w", s.Source, signing.ErrMalformedSignature)
	}
	msg, err := s.message()
	if err != nil {
		return err
	}
	if err := controller.Verify(ss.KeyID, sig, msg); err != nil {
		return fmt.Errorf("snapshot of %s: %w: it was not signed by the controller, or edited after", s.Source, err)
	}
	switch s.Kind {
	case KindRegistry:
		if s.Index == nil {
			return fmt.Errorf("snapshot of %s: a Registry snapshot without the index proof", s.Source)
		}
	case KindPlain, KindToolManifests, KindGateway:
	default:
		return fmt.Errorf("snapshot of %s: unknown kind %q", s.Source, s.Kind)
	}
	if s.Source == "" || s.Sequence < 1 {
		return errors.New("a snapshot without a source or sequence")
	}
	return nil
}

// IndexMark names the high-water mark of a Registry snapshot's writer index: the source, the
// registry id and the revision the latest override accepted (sequence: the index's). A gateway
// keeps it besides the snapshot's own mark, so a registry's index never goes back there except
// by an override, whatever happens to the controller's records (a ManifestRegistry deleted and
// made again at an older commit, say). "" for other kinds.
func (s Snapshot) IndexMark() string {
	if s.Kind != KindRegistry || s.Index == nil {
		return ""
	}
	return s.Source + " index " + s.Index.ID + " since " + cmp.Or(s.AcceptedRevision, "the first apply")
}

// MarkDigest is the digest a gateway's high-water mark of s records: the entries' Digest and,
// when s binds policies, " policies <Policies>" and (KindGateway) " enforcing <names>". Two
// snapshots of one sequence that differ in what they enforce then cannot both be served (a
// rendering whose only change was its policies or spec.policies.names, put back after the
// newer one). Without policies it is Digest, as marks stored before policies say.
func (s Snapshot) MarkDigest() string {
	d := s.Digest
	if s.Policies != "" {
		d += " policies " + s.Policies
	}
	if s.Kind == KindGateway && (s.Policies != "" || len(s.PolicyNames) > 0) {
		d += " enforcing " + strings.Join(s.PolicyNames, ",")
	}
	return d
}

// Describe is how logs, status and pod annotations name a verified snapshot:
// `<source> <revision> (sequence N)`.
func (s Snapshot) Describe() string {
	out := s.Source
	if s.Revision != "" {
		out += " " + s.Revision
	}
	return out + " (sequence " + strconv.FormatInt(s.Sequence, 10) + ")"
}

// GatewaySource is how snapshots name a gateway: "ReversiGateway <namespace>/<name>".
func GatewaySource(namespace, name string) string { return "ReversiGateway " + namespace + "/" + name }

// AttestGateway signs the gateway snapshot of b (KindGateway, source GatewaySource): the
// sources of b's other snapshots and the digest of all its entries; unsigned lists the Plain
// sources the gateway accepts without writer signatures.
//
// s.PolicyNames names the policies the gateway enforces (sorted here); s.Policies is computed.
func (b *Bundle) AttestGateway(s Snapshot, unsigned []string, signer *signing.Signer) (SignedSnapshot, error) {
	s.Kind, s.Digest, s.Sources, s.Unsigned = KindGateway, b.Digest(), b.Sources(), slices.Sorted(slices.Values(unsigned))
	s.Policies = b.PolicyDigest()
	if len(s.PolicyNames) > 0 {
		s.PolicyNames = slices.Sorted(slices.Values(s.PolicyNames))
	}
	ss, err := Sign(s, signer)
	if err != nil {
		return SignedSnapshot{}, err
	}
	b.Snapshots = append(b.Snapshots, ss)
	return ss, nil
}

// Sources are the sources of b's snapshots other than its gateway snapshot, sorted.
func (b Bundle) Sources() []string {
	var out []string
	for _, ss := range b.Snapshots {
		if ss.Snapshot.Kind != KindGateway {
			out = append(out, ss.Snapshot.Source)
		}
	}
	slices.Sort(out)
	return out
}

// Attest signs a snapshot of the entries of s.Source with the controller's key and adds it
// to the bundle; s.Digest is computed here.
func (b *Bundle) Attest(s Snapshot, signer *signing.Signer) (SignedSnapshot, error) {
	s.Digest = b.SourceDigest(s.Source)
	s.Policies = b.SourcePolicyDigest(s.Source)
	ss, err := Sign(s, signer)
	if err != nil {
		return SignedSnapshot{}, err
	}
	b.Snapshots = append(b.Snapshots, ss)
	return ss, nil
}
