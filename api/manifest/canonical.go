package manifest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// MarshalJSON writes `never`, `always`, or the object form of the rules (seed: Approval).
func (a Approval) MarshalJSON() ([]byte, error) {
	switch {
	case !a.Required:
		return []byte(`"never"`), nil
	case a.Rules == nil:
		return []byte(`"always"`), nil
	default:
		return json.Marshal(a.Rules)
	}
}

// CanonicalJSON is the byte form that checksums and signatures cover: the normalised manifest
// as compact JSON with object keys sorted at every level, no HTML escaping and no trailing
// newline. It is the same for a manifest written in YAML or JSON, in any key order, with
// defaults written out or left implicit.
func CanonicalJSON(m *Manifest) ([]byte, error) {
	return CanonicalJSONOf(m)
}

// CanonicalJSONOf writes any JSON-encodable value the same canonical way: compact, object keys
// sorted at every level, numbers exactly as written, no HTML escaping, no trailing newline.
func CanonicalJSONOf(value any) ([]byte, error) {
	b, err := json.Marshal(value)
	if err != nil {
		return nil, err
	}
	// Decoding into generic values and encoding again sorts the keys of every object
	// (encoding/json writes map keys in order); UseNumber keeps numbers exactly as written.
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n")), nil
}

// Checksum is the lowercase hex SHA-256 (64 characters) of CanonicalJSON(m).
// The registry shows its first 12 characters (seed: Registry, `40301964dd00`).
func Checksum(m *Manifest) (string, error) {
	b, err := CanonicalJSON(m)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}
