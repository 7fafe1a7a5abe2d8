package auth

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/google/renameio/v2"
)

// The API key file (`auth.keys`, seed "MCP gateway", Config). It is JSON:
//
//	{"keys": [
//	  {"id": "3f9c2a7d10be", "principal": "ci-bot", "role": "agent",
//	   "max_permissions": ["fs:read"], "groups": ["platform"],
//	   "uid": "8d1f...", "email": "ci-bot@corp.example",
//	   "hash": "sha256:<64 hex>", "created": "2026-11-30T06:00:00Z"}
//	]}
//
// Only the SHA-256 of each secret is stored. A secret is `rvk_<id>_<43 base64url characters>`
// (256 random bits), so a plain SHA-256 is enough: the slow hashes (argon2, bcrypt) protect
// guessable passwords, and would cost tens of milliseconds on every HTTP request. The id in
// the secret finds the entry; the hashes are compared in constant time.
//
// max_permissions caps the session scope (absent: the gateway's `permissions`; [] : no
// permission at all). groups are extra role names the principal holds for approvals (a
// manifest's approval.roles), besides its Reversi role. uid and email (optional) are the
// principal's identity for the actor check of approvals (issue 16): an approver whose uid is
// the key's uid, or whose username is the key's email, is the actor under another name.

// KeyPrefix starts every API key secret; a bearer token without it is not an API key.
const KeyPrefix = "rvk_"

// KeyFile is the API key file.
type KeyFile struct {
	Keys []KeyEntry `json:"keys"`
}

// KeyEntry is one API key.
type KeyEntry struct {
	// ID is 12 lowercase hex characters, unique in the file; it is part of the secret.
	ID        string `json:"id"`
	Principal string `json:"principal"`
	Role      Role   `json:"role"`
	// MaxPermissions caps the session scope; nil (absent) means no cap.
	MaxPermissions *[]string `json:"max_permissions,omitempty"`
	Groups         []string  `json:"groups,omitempty"`
	// UID and Email are the principal's uid and e-mail (optional; see the file format).
	UID   string `json:"uid,omitempty"`
	Email string `json:"email,omitempty"`
	// Hash is "sha256:<64 lowercase hex>" of the whole secret.
	Hash    string    `json:"hash"`
	Created time.Time `json:"created,omitzero"`
}

var (
	keyIDRe   = regexp.MustCompile(`^[0-9a-f]{12}$`)
	keyHashRe = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
)

// ParseKeyFile reads a key file strictly: unknown fields, a missing principal, an unknown
// role, a malformed id or hash and duplicate ids are errors, all reported at once, each
// naming the entry (keys[i]).
func ParseKeyFile(data []byte) (*KeyFile, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f KeyFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("not a key file (%v): expected {\"keys\": [{\"id\", \"principal\", \"role\", \"hash\", ...}]}", err)
	}
	var errs []error
	seen := map[string]bool{}
	for i, k := range f.Keys {
		bad := func(format string, a ...any) {
			errs = append(errs, fmt.Errorf("keys[%d]: "+format, append([]any{i}, a...)...))
		}
		if !keyIDRe.MatchString(k.ID) {
			bad("id %q: expected 12 lowercase hex characters", k.ID)
		} else if seen[k.ID] {
			bad("id %s appears twice", k.ID)
		}
		seen[k.ID] = true
		if strings.TrimSpace(k.Principal) == "" {
			bad("principal: required")
		}
		if _, err := ParseRole(string(k.Role)); err != nil {
			bad("role: %v", err)
		}
		if !keyHashRe.MatchString(k.Hash) {
			bad("hash: expected sha256:<64 lowercase hex>")
		}
		if err := checkKeyIdentity(k.UID, k.Email); err != nil {
			bad("%v", err)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &f, nil
}

// IdentityError is a key's uid or email that cannot be used. Field says which ("uid" or
// "email"), so a caller can name its own setting (the CLI's --uid and --email) without
// reading the text, which is `<field> "<value>": <what is expected>`.
type IdentityError struct {
	Field, Value, Want string
}

func (e *IdentityError) Error() string { return fmt.Sprintf("%s %q: %s", e.Field, e.Value, e.Want) }

// checkKeyIdentity checks a key's optional uid and email: no spaces, at most 253 characters
// (the ApprovalRequest fields they go into), and an email with one @ between non-empty parts.
// Errors are *IdentityError.
func checkKeyIdentity(uid, email string) error {
	if uid != "" && (len(uid) > 253 || strings.TrimSpace(uid) != uid || strings.ContainsAny(uid, " \t\n")) {
		return &IdentityError{Field: "uid", Value: uid, Want: "at most 253 characters, no spaces"}
	}
	if email != "" {
		local, domain, ok := strings.Cut(email, "@")
		if len(email) > 253 || !ok || local == "" || domain == "" || strings.Contains(domain, "@") || strings.ContainsAny(email, " \t\n") {
			return &IdentityError{Field: "email", Value: email, Want: "expected name@domain (at most 253 characters)"}
		}
	}
	return nil
}

// LoadKeyFile reads and parses the key file at path. Errors name the file.
func LoadKeyFile(path string) (*KeyFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth.keys: %w", err)
	}
	f, err := ParseKeyFile(data)
	if err != nil {
		return nil, fmt.Errorf("auth.keys %s: %w", path, err)
	}
	return f, nil
}

// HashSecret is the stored form of a secret: "sha256:<hex>".
func HashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// KeyIdentity is the optional identity of a new key's principal (KeyEntry.UID, Email).
type KeyIdentity struct {
	UID, Email string
}

// NewKey makes a key entry and its secret. The secret is shown once and never stored. ident
// (optional, at most one) sets the entry's uid and email. Errors: no principal, an unknown
// role, a bad uid or email (an *IdentityError).
func NewKey(principal string, role Role, maxPermissions *[]string, groups []string, ident ...KeyIdentity) (KeyEntry, string, error) {
	if strings.TrimSpace(principal) == "" {
		return KeyEntry{}, "", errors.New("a key needs a principal")
	}
	var id0 KeyIdentity
	if len(ident) > 0 {
		id0 = ident[0]
	}
	if err := checkKeyIdentity(id0.UID, id0.Email); err != nil {
		return KeyEntry{}, "", err
	}
	if _, err := ParseRole(string(role)); err != nil {
		return KeyEntry{}, "", err
	}
	var id [6]byte
	var sec [32]byte
	if _, err := rand.Read(id[:]); err != nil {
		return KeyEntry{}, "", err
	}
	if _, err := rand.Read(sec[:]); err != nil {
		return KeyEntry{}, "", err
	}
	e := KeyEntry{ID: hex.EncodeToString(id[:]), Principal: principal, Role: role, MaxPermissions: maxPermissions,
		Groups: groups, UID: id0.UID, Email: id0.Email, Created: time.Now().UTC().Truncate(time.Second)}
	secret := KeyPrefix + e.ID + "_" + base64.RawURLEncoding.EncodeToString(sec[:])
	e.Hash = HashSecret(secret)
	return e, secret, nil
}

// AddKey appends a new key to the file at path (created, mode 0600, when missing) and returns
// the entry and its secret. The file is replaced atomically. A bad uid or email of the new key
// is NewKey's *IdentityError; the existing file's problems name the file and carry none.
func AddKey(path, principal string, role Role, maxPermissions *[]string, groups []string, ident ...KeyIdentity) (KeyEntry, string, error) {
	f := &KeyFile{}
	if data, err := os.ReadFile(path); err == nil {
		if f, err = ParseKeyFile(data); err != nil {
			return KeyEntry{}, "", fmt.Errorf("%s: %w", path, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return KeyEntry{}, "", err
	}
	e, secret, err := NewKey(principal, role, maxPermissions, groups, ident...)
	if err != nil {
		return KeyEntry{}, "", err
	}
	f.Keys = append(f.Keys, e)
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return KeyEntry{}, "", err
	}
	if err := renameio.WriteFile(path, append(data, '\n'), 0o600); err != nil {
		return KeyEntry{}, "", err
	}
	return e, secret, nil
}

// keyRing checks API key secrets against a key file.
type keyRing struct{ byID map[string]KeyEntry }

func newKeyRing(f *KeyFile) *keyRing {
	r := &keyRing{byID: make(map[string]KeyEntry, len(f.Keys))}
	for _, k := range f.Keys {
		r.byID[k.ID] = k
	}
	return r
}

// check returns the identity of secret, or an error that does not say which part was wrong.
func (r *keyRing) check(secret string) (*Identity, error) {
	rest, ok := strings.CutPrefix(secret, KeyPrefix)
	id, _, ok2 := strings.Cut(rest, "_")
	k, found := r.byID[id]
	if !ok || !ok2 || !found || subtle.ConstantTimeCompare([]byte(HashSecret(secret)), []byte(k.Hash)) != 1 {
		return nil, errors.New("unknown API key")
	}
	ident := &Identity{Principal: k.Principal, Role: k.Role, Groups: k.Groups, Method: MethodKey, KeyID: k.ID, UID: k.UID, Email: k.Email}
	if k.MaxPermissions != nil {
		ident.MaxPermissions = append([]string{}, (*k.MaxPermissions)...)
	}
	return ident, nil
}
