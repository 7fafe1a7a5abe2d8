// Package signing holds the Ed25519 keys that sign manifest versions: key generation, PEM
// files, key ids, signing and trusted key sets. Keys and signatures go through
// sigstore/sigstore (pkg/signature, pkg/cryptoutils).
//
// Source: seed "Tool manifests", Registry: versions, signing, trust.
package signing

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/google/renameio/v2"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
)

// Message is the byte string a manifest version's signature covers:
// `reversi-manifest:<tool>@<version>:<checksum>`. Binding tool and version means a signature
// copied onto another version or tool does not verify.
func Message(tool string, version int, checksum string) []byte {
	return []byte("reversi-manifest:" + tool + "@" + strconv.Itoa(version) + ":" + checksum)
}

// PolicyMessage is the byte string a policy version's signature covers:
// `reversi-policy:<name>@<version>:<checksum>`. Its prefix differs from Message's, so a
// manifest version's signature never verifies as a policy's (nor the other way round), even
// for a tool and a policy of the same name, version and checksum.
func PolicyMessage(name string, version int, checksum string) []byte {
	return []byte("reversi-policy:" + name + "@" + strconv.Itoa(version) + ":" + checksum)
}

// KeyID is the stable short fingerprint of a public key: the first 16 hex characters of the
// SHA-256 of its PKIX DER encoding.
func KeyID(pub ed25519.PublicKey) (string, error) {
	der, err := cryptoutils.MarshalPublicKeyToDER(pub)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:8]), nil
}

// GenerateKey makes a new Ed25519 key pair and returns the private key as PKCS#8 PEM and the
// public key as PKIX PEM (the forms ParseSigner and ParseTrustSet read).
func GenerateKey() (privPEM, pubPEM []byte, err error) {
	_, priv, err := signature.NewDefaultED25519SignerVerifier()
	if err != nil {
		return nil, nil, err
	}
	if privPEM, err = cryptoutils.MarshalPrivateKeyToPEM(priv); err != nil {
		return nil, nil, err
	}
	if pubPEM, err = cryptoutils.MarshalPublicKeyToPEM(priv.Public().(ed25519.PublicKey)); err != nil {
		return nil, nil, err
	}
	return privPEM, pubPEM, nil
}

// GenerateKeyFiles writes a new Ed25519 key pair: PREFIX.key (PKCS#8 PEM, mode 0600) and
// PREFIX.pub (PKIX PEM, mode 0644), creating PREFIX's folder, and returns the key id.
// Existing files are never overwritten (an error names them).
func GenerateKeyFiles(prefix string) (string, error) {
	keyPath, pubPath := prefix+".key", prefix+".pub"
	if err := os.MkdirAll(filepath.Dir(keyPath), 0o700); err != nil {
		return "", err
	}
	for _, p := range []string{keyPath, pubPath} {
		if _, err := os.Lstat(p); err == nil {
			return "", fmt.Errorf("%s already exists: keygen never overwrites a key; choose another prefix", p)
		}
	}
	privPEM, pubPEM, err := GenerateKey()
	if err != nil {
		return "", err
	}
	if err := renameio.WriteFile(keyPath, privPEM, 0o600); err != nil {
		return "", err
	}
	if err := renameio.WriteFile(pubPath, pubPEM, 0o644); err != nil {
		return "", err
	}
	s, err := ParseSigner(privPEM)
	if err != nil {
		return "", err
	}
	return s.KeyID, nil
}

// Signer signs manifest versions with one private key.
type Signer struct {
	signer *signature.ED25519Signer
	public ed25519.PublicKey
	// KeyID is the fingerprint of the signer's public key.
	KeyID string
}

// LoadSigner reads a PKCS#8 PEM Ed25519 private key. warning is non-empty when the file can
// be read by other users (it still loads: the caller prints the warning). A missing,
// malformed or non-Ed25519 key is an error naming the file.
func LoadSigner(path string) (s *Signer, warning string, err error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, "", fmt.Errorf("signing key: %w", err)
	}
	if info.Mode().Perm()&0o077 != 0 {
		warning = fmt.Sprintf("warning: signing key %s is readable by others (mode %04o): chmod 600 %s", path, info.Mode().Perm(), path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("signing key: %w", err)
	}
	s, err = ParseSigner(data)
	if err != nil {
		return nil, "", fmt.Errorf("signing key %s: %w", path, err)
	}
	return s, warning, nil
}

// ParseSigner reads a PKCS#8 PEM Ed25519 private key.
func ParseSigner(pemBytes []byte) (*Signer, error) {
	if block, _ := pem.Decode(pemBytes); block == nil || block.Type != string(cryptoutils.PrivateKeyPEMType) {
		return nil, errors.New("not a PEM \"PRIVATE KEY\" (PKCS#8): use a key written by reversi keygen")
	}
	key, err := cryptoutils.UnmarshalPEMToPrivateKey(pemBytes, cryptoutils.SkipPassword)
	if err != nil {
		return nil, fmt.Errorf("malformed private key: %w", err)
	}
	priv, ok := key.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("a %T is not an Ed25519 key: use a key written by reversi keygen", key)
	}
	signer, err := signature.LoadED25519Signer(priv)
	if err != nil {
		return nil, err
	}
	id, err := KeyID(priv.Public().(ed25519.PublicKey))
	if err != nil {
		return nil, err
	}
	return &Signer{signer: signer, public: priv.Public().(ed25519.PublicKey), KeyID: id}, nil
}

// PublicKeyPEM is the signer's public key as PKIX PEM (what ParseTrustSet reads).
func (s *Signer) PublicKeyPEM() ([]byte, error) {
	return cryptoutils.MarshalPublicKeyToPEM(s.public)
}

// Sign returns the Ed25519 signature (64 bytes) of msg.
func (s *Signer) Sign(msg []byte) ([]byte, error) {
	return s.signer.SignMessage(bytes.NewReader(msg))
}

// TrustSet is a set of trusted Ed25519 public keys, by key id. A set (a PEM bundle) lets keys
// rotate without a flag day: sign with the new key once both are trusted, then drop the old.
type TrustSet struct {
	verifiers map[string]*signature.ED25519Verifier
}

// ParseTrustSet reads one or more PEM "PUBLIC KEY" blocks (PKIX). Every block must be an
// Ed25519 public key; anything else in the bundle is an error (fail closed). An empty bundle
// is an error too.
func ParseTrustSet(pemBundle []byte) (*TrustSet, error) {
	t := &TrustSet{verifiers: map[string]*signature.ED25519Verifier{}}
	rest := pemBundle
	for n := 1; ; n++ {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			if len(bytes.TrimSpace(rest)) > 0 {
				return nil, fmt.Errorf("key %d: not a PEM block", n)
			}
			break
		}
		pub, err := cryptoutils.UnmarshalPEMToPublicKey(pem.EncodeToMemory(block))
		if err != nil {
			return nil, fmt.Errorf("key %d: %w", n, err)
		}
		edPub, ok := pub.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("key %d: a %T is not an Ed25519 public key", n, pub)
		}
		v, err := signature.LoadED25519Verifier(edPub)
		if err != nil {
			return nil, fmt.Errorf("key %d: %w", n, err)
		}
		id, err := KeyID(edPub)
		if err != nil {
			return nil, err
		}
		t.verifiers[id] = v
	}
	if len(t.verifiers) == 0 {
		return nil, errors.New("no public key found: expected PEM \"PUBLIC KEY\" blocks")
	}
	return t, nil
}

// LoadTrustSet reads a PEM bundle file (see ParseTrustSet).
func LoadTrustSet(path string) (*TrustSet, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("trusted keys: %w", err)
	}
	t, err := ParseTrustSet(data)
	if err != nil {
		return nil, fmt.Errorf("trusted keys %s: %w", path, err)
	}
	return t, nil
}

// KeyIDs lists the trusted key ids, sorted.
func (t *TrustSet) KeyIDs() []string {
	ids := make([]string, 0, len(t.verifiers))
	for id := range t.verifiers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Verify checks that sig is keyID's signature of msg and that keyID is trusted. Errors say
// which: an untrusted key id (ErrUntrusted), or a signature that does not verify with the key
// it names (ErrBadSignature).
func (t *TrustSet) Verify(keyID string, sig, msg []byte) error {
	v, ok := t.verifiers[keyID]
	if !ok {
		return fmt.Errorf("signed by key %s, which is not trusted (trusted: %v): %w", keyID, t.KeyIDs(), ErrUntrusted)
	}
	if err := v.VerifySignature(bytes.NewReader(sig), bytes.NewReader(msg)); err != nil {
		return fmt.Errorf("%w with key %s: the manifest, its tool or version was changed after signing, or it was signed by another key", ErrBadSignature, keyID)
	}
	return nil
}

var _ crypto.PublicKey = ed25519.PublicKey(nil)

// Why a signature was refused. Verify wraps ErrUntrusted or ErrBadSignature; the packages that
// read signed data (registry, bundle) wrap ErrNotSigned and ErrMalformedSignature. Each is
// wrapped with %w into a message that reads as a sentence (the sentinel's text is part of it),
// so callers decide with errors.Is (or IsSignatureError), never by matching the text.
var (
	// ErrUntrusted: the signing key is not in the trust set.
	ErrUntrusted = errors.New("add the key to the trusted keys, or sign again with a trusted key")
	// ErrBadSignature: the signature does not verify with the key it names.
	ErrBadSignature = errors.New("the signature does not verify")
	// ErrNotSigned: trusted keys are set (or the reader requires a signature), and there is none.
	ErrNotSigned = errors.New("not signed")
	// ErrMalformedSignature: the signature is not base64, or its key id is missing.
	ErrMalformedSignature = errors.New("malformed")
)

// IsSignatureError reports whether err (or an error it wraps) is a refused signature: one of
// ErrUntrusted, ErrBadSignature, ErrNotSigned and ErrMalformedSignature.
func IsSignatureError(err error) bool {
	return errors.Is(err, ErrUntrusted) || errors.Is(err, ErrBadSignature) ||
		errors.Is(err, ErrNotSigned) || errors.Is(err, ErrMalformedSignature)
}
