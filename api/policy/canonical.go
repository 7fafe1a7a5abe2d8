package policy

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"slices"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// CanonicalJSON is the byte form a policy's checksum and signature cover: the decoded policy
// (durations in milliseconds, defaults written out) as compact JSON with keys sorted at every
// level (manifest.CanonicalJSONOf). It is the same for a policy written in YAML or JSON, in any
// key order. Rule and test order is kept: it is part of the policy (rules are evaluated, and
// their reasons reported, in order).
func CanonicalJSON(p *Policy) ([]byte, error) { return manifest.CanonicalJSONOf(p) }

// Checksum is the lowercase hex SHA-256 of CanonicalJSON(p).
func Checksum(p *Policy) (string, error) {
	b, err := CanonicalJSON(p)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// SetChecksum is the checksum of a policy set, the gateway's `policy_checksum`: the lowercase
// hex SHA-256 of the canonical JSON of the list of policies sorted by name. File names and the
// order of files and documents do not count (moving a policy to another file, or renaming a
// file, keeps the checksum); any change to a policy, tests and descriptions included, changes
// it, since it changes what was reviewed and signed. "" for an empty set (no policy loaded).
// Names are unique in a set that decoded without errors.
func SetChecksum(ps []*Policy) (string, error) {
	if len(ps) == 0 {
		return "", nil
	}
	sorted := slices.Clone(ps)
	slices.SortStableFunc(sorted, func(a, b *Policy) int { return cmp.Compare(a.Name, b.Name) })
	b, err := manifest.CanonicalJSONOf(sorted)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}
