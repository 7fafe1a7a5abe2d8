package source

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	pgperrors "github.com/ProtonMail/go-crypto/openpgp/errors"
	"github.com/ProtonMail/go-crypto/openpgp/packet"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/hiddeco/sshsig"
	"golang.org/x/crypto/ssh"
)

// Mode says which objects Verify checks.
type Mode string

const (
	// ModeHEAD verifies the checked-out commit. The empty Mode means ModeHEAD.
	ModeHEAD Mode = "HEAD"
	// ModeTag verifies the annotated tag of a Tag or SemVer ref: its signature, and that the
	// tag object is named as the ref (refs/tags/v1.2.0 must hold a tag object "v1.2.0").
	ModeTag Mode = "Tag"
	// ModeTagAndHEAD verifies both.
	ModeTagAndHEAD Mode = "TagAndHEAD"
	// ModeChain verifies the fetched commit and every commit reachable from it but not from
	// Options.Since (Since..HEAD in git's notation, merges included): each must be signed by
	// a trusted key. Without Since (a first apply) only the fetched commit is verified: the
	// history before it is trusted on first use. ModeHEAD, like Flux, verifies only the
	// fetched commit, so an unsigned commit under a signed one passes it.
	ModeChain Mode = "Chain"
)

// SSHNamespace is the sshsig namespace git uses for commit and tag signatures.
const SSHNamespace = "git"

const (
	sshSignaturePrefix = "-----BEGIN SSH SIGNATURE-----"
	pgpSignaturePrefix = "-----BEGIN PGP SIGNATURE-----"
)

// SignatureType names the kind of a signature.
type SignatureType string

const (
	SignatureSSH     SignatureType = "ssh"
	SignatureOpenPGP SignatureType = "openpgp"
)

// KeyRing is a set of trusted public keys read from a Secret's data by ParseKeys.
type KeyRing struct {
	ssh []sshKey
	pgp []pgpKey
}

type sshKey struct {
	entry       string
	key         ssh.PublicKey
	fingerprint string
}

type pgpKey struct {
	entry   string
	armored string
}

// Len is the number of keys (an `*.asc` entry counts once however many keys it holds).
func (k *KeyRing) Len() int {
	if k == nil {
		return 0
	}
	return len(k.ssh) + len(k.pgp)
}

// Lookup finds a key of the ring by the identifier a verifier reports for it: an SSH key by
// its SHA256 fingerprint ("SHA256:..."), an OpenPGP key by its primary key's 16-hex-digit key
// ID or its full fingerprint (case-insensitive), as Flux's source-controller names the key a
// signature verified with. It returns the Secret entry the key came from.
func (k *KeyRing) Lookup(id string) (entry string, ok bool) {
	if k == nil || id == "" {
		return "", false
	}
	for _, s := range k.ssh {
		if s.fingerprint == id {
			return s.entry, true
		}
	}
	for _, p := range k.pgp {
		el, err := openpgp.ReadArmoredKeyRing(strings.NewReader(p.armored))
		if err != nil {
			continue
		}
		for _, e := range el {
			if e.PrimaryKey == nil {
				continue
			}
			if strings.EqualFold(e.PrimaryKey.KeyIdString(), id) || strings.EqualFold(hex.EncodeToString(e.PrimaryKey.Fingerprint), id) {
				return p.entry, true
			}
		}
	}
	return "", false
}

// ParseKeys reads trusted keys from a Secret's data: entries named `*.sshpub` hold SSH
// public keys in authorized_keys format (one or more lines; comments and blank lines
// allowed); entries named `*.asc` hold an armored OpenPGP public key block (one or more
// keys). Other entries are ignored. It fails with ErrInvalidKeys, naming the entry, when an
// entry does not parse, and when no key is found at all (fail closed: an empty key set
// would otherwise trust nothing silently or, worse, be mistaken for "no verification").
func ParseKeys(data map[string][]byte) (*KeyRing, error) {
	names := make([]string, 0, len(data))
	for name := range data {
		names = append(names, name)
	}
	sort.Strings(names)
	kr := &KeyRing{}
	var ignored []string
	for _, name := range names {
		b := data[name]
		switch {
		case strings.HasSuffix(name, ".sshpub"):
			n := 0
			for rest := b; len(bytes.TrimSpace(rest)) > 0; {
				line := rest
				if i := bytes.IndexByte(rest, '\n'); i >= 0 {
					line, rest = rest[:i], rest[i+1:]
				} else {
					rest = nil
				}
				line = bytes.TrimSpace(line)
				if len(line) == 0 || line[0] == '#' {
					continue
				}
				pub, _, _, _, err := ssh.ParseAuthorizedKey(line)
				if err != nil {
					return nil, &Error{Op: "keys", Subject: name, Kind: ErrInvalidKeys, Err: err,
						Hint: "each line must be an SSH public key in authorized_keys format (ssh-ed25519 AAAA... comment)"}
				}
				kr.ssh = append(kr.ssh, sshKey{entry: name, key: pub, fingerprint: ssh.FingerprintSHA256(pub)})
				n++
			}
			if n == 0 {
				return nil, &Error{Op: "keys", Subject: name, Kind: ErrInvalidKeys, Err: errors.New("no SSH public key in the entry")}
			}
		case strings.HasSuffix(name, ".asc"):
			el, err := openpgp.ReadArmoredKeyRing(bytes.NewReader(b))
			if err == nil && len(el) == 0 {
				err = errors.New("no key in the block")
			}
			if err != nil {
				return nil, &Error{Op: "keys", Subject: name, Kind: ErrInvalidKeys, Err: err,
					Hint: "the entry must be an armored OpenPGP public key (gpg --armor --export KEYID)"}
			}
			kr.pgp = append(kr.pgp, pgpKey{entry: name, armored: string(b)})
		default:
			ignored = append(ignored, name)
		}
	}
	if kr.Len() == 0 {
		return nil, &Error{Op: "keys", Kind: ErrInvalidKeys,
			Err:  fmt.Errorf("no *.sshpub or *.asc entry (entries: %s)", strings.Join(ignored, ", ")),
			Hint: "add SSH public keys as NAME.sshpub and OpenPGP public keys as NAME.asc"}
	}
	return kr, nil
}

// Signer says which trusted key verified a signature.
type Signer struct {
	Type SignatureType
	// Entry is the Secret entry the key came from, e.g. "alice.sshpub".
	Entry string
	// Fingerprint is "SHA256:..." for SSH keys and the upper-case hex fingerprint of the
	// primary key for OpenPGP.
	Fingerprint string
}

func (s *Signer) String() string {
	return fmt.Sprintf("%s key %s (%s)", s.Type, s.Fingerprint, s.Entry)
}

// Verification is the outcome of Verify: the signer of each object checked.
type Verification struct {
	Commit *Signer // set when the mode covers HEAD (HEAD, TagAndHEAD, Chain)
	Tag    *Signer // set when the mode covers the tag
	// Chain is the number of commits verified in mode Chain, the fetched one included (1 on
	// a first apply).
	Chain int
}

// Verify checks the signatures that mode asks for on the fetched artifact against keys:
// the fetched commit (HEAD), the annotated tag the ref named (Tag), or the fetched commit
// and every commit since Artifact.Since (Chain). It fails closed with ErrVerification —
// saying which commit or tag and why; in mode Chain the first failing commit, oldest first,
// by short hash and subject — when an object is unsigned, signed by a key not in keys,
// signed with a signature that does not match its content (tampered), signed in an
// unsupported format (x509), when a Tag mode is used with a ref that is not a tag or with a
// lightweight tag, or with a tag object whose own name is not the ref's, or when the fetched history does not reach Since (the chain cannot be
// checked). A nil or empty KeyRing is ErrInvalidKeys; an unknown mode is ErrInvalidOptions.
func Verify(a *Artifact, mode Mode, keys *KeyRing) (*Verification, error) {
	if mode == "" {
		mode = ModeHEAD
	}
	if mode != ModeHEAD && mode != ModeTag && mode != ModeTagAndHEAD && mode != ModeChain {
		return nil, optionsError("verify mode %q is not one of HEAD, Tag, TagAndHEAD, Chain", mode)
	}
	if keys.Len() == 0 {
		return nil, &Error{Op: "verify", Kind: ErrInvalidKeys, Err: errors.New("no trusted keys")}
	}
	if a == nil || a.store == nil {
		return nil, &Error{Op: "verify", Kind: ErrInvalidOptions, Err: errors.New("the artifact has no repository (cleaned up, or not made by Fetch)")}
	}
	v := &Verification{}
	if mode == ModeTag || mode == ModeTagAndHEAD {
		if a.Tag == "" {
			return nil, &Error{Op: "verify", Subject: a.Revision, Kind: ErrVerification,
				Err: fmt.Errorf("mode %s needs a tag, but the ref is not a tag or semver ref", mode), Hint: "use mode HEAD or a tag/semver ref"}
		}
		tag, err := tagOf(a.store, a.Tag, a.tagObject, a.Commit)
		if err != nil {
			return nil, err
		}
		if v.Tag, err = VerifyTag(tag, keys); err != nil {
			return nil, err
		}
	}
	if mode == ModeHEAD || mode == ModeTagAndHEAD || mode == ModeChain {
		c, err := object.GetCommit(a.store, plumbing.NewHash(a.Commit))
		if err != nil {
			return nil, &Error{Op: "verify", Subject: "commit " + a.Commit, Kind: ErrVerification, Err: err}
		}
		if v.Commit, err = VerifyCommit(c, keys); err != nil {
			return nil, err
		}
		v.Chain = 1
	}
	if mode == ModeChain && a.Since != "" && a.Since != a.Commit {
		w, err := walkRange(a.store, plumbing.NewHash(a.Commit), plumbing.NewHash(a.Since), a.maxWalk)
		if err != nil {
			return nil, &Error{Op: "verify", Subject: a.Revision, Kind: ErrVerification, Err: err}
		}
		if !w.complete {
			e := a.historyTooShort("verify", a.Since)
			e.Kind = ErrVerification
			e.Err = fmt.Errorf("mode Chain cannot check every commit since %s: %w", short(a.Since), e.Err)
			return nil, e
		}
		for _, c := range oldestFirst(w.commits) {
			if c.Hash.String() == a.Commit {
				continue
			}
			subj := fmt.Sprintf("commit %s %q", short(c.Hash.String()), subject(c))
			if _, err := verifyObject(subj, c.PGPSignature, c.EncodeWithoutSignature, c.Verify, keys); err != nil {
				var se *Error
				if errors.As(err, &se) {
					se.Hint = fmt.Sprintf("mode Chain needs every commit since %s signed by a trusted key; %s", short(a.Since), se.Hint)
				}
				return nil, err
			}
			v.Chain++
		}
	}
	return v, nil
}

// tagOf returns the annotated tag object of the tag ref name (refs/tags/<name>), checking
// that the object is named name itself and points to commit. The name is part of what the
// signature covers: a signed tag object published under another ref (v1.0.0's object pushed
// as refs/tags/v1.9.0) would otherwise pass as a signed v1.9.0. Errors are ErrVerification.
func tagOf(st storer.EncodedObjectStorer, name string, obj plumbing.Hash, commit string) (*object.Tag, error) {
	if obj.IsZero() {
		return nil, &Error{Op: "verify", Subject: "tag " + name, Kind: ErrVerification,
			Err: errors.New("the tag is lightweight (not annotated), so it carries no signature"), Hint: "create it with git tag -s"}
	}
	tag, err := object.GetTag(st, obj)
	if err != nil {
		return nil, &Error{Op: "verify", Subject: "tag " + name, Kind: ErrVerification, Err: err}
	}
	if tag.Name != name {
		return nil, &Error{Op: "verify", Subject: "tag " + name, Kind: ErrVerification,
			Err: fmt.Errorf("the tag object %s is named %q, not %q: it was published under another ref name (git describe says: tag '%s' is really '%s')",
				short(obj.String()), clip(tag.Name, maxQuotedTagName), name, name, clip(tag.Name, maxQuotedTagName)),
			Hint: "a signed tag counts only under its own name; delete refs/tags/" + name + ", or create and sign a tag named " + name}
	}
	if tag.TargetType != plumbing.CommitObject || tag.Target.String() != commit {
		return nil, &Error{Op: "verify", Subject: "tag " + name, Kind: ErrVerification,
			Err: fmt.Errorf("the tag does not point to the fetched commit %s", commit)}
	}
	return tag, nil
}

// verifyTagRef verifies a semver candidate with what chooseTag fetched: the tag object's
// name and signature, and for TagAndHEAD its commit's. A lightweight candidate fails at
// once, without reading the store.
func verifyTagRef(st storer.EncodedObjectStorer, r resolved, v *VerifyOptions) error {
	var obj plumbing.Hash
	if r.annotated() {
		obj = plumbing.NewHash(r.object)
	}
	tag, err := tagOf(st, r.tag, obj, r.hash)
	if err != nil {
		return err
	}
	if _, err := VerifyTag(tag, v.Keys); err != nil {
		return err
	}
	if v.Mode == ModeTagAndHEAD {
		c, err := object.GetCommit(st, plumbing.NewHash(r.hash))
		if err != nil {
			return &Error{Op: "verify", Subject: "commit " + r.hash, Kind: ErrVerification, Err: err}
		}
		if _, err := verifyObject("commit "+short(r.hash), c.PGPSignature, c.EncodeWithoutSignature, c.Verify, v.Keys); err != nil {
			var se *Error
			if errors.As(err, &se) {
				se.Err = fmt.Errorf("commit %s: %w", short(r.hash), se.Err)
			}
			return err
		}
	}
	return nil
}

// VerifyCommit verifies the signature (the gpgsig header) of c against keys and returns
// the key that made it. Errors are ErrVerification (see Verify) or ErrInvalidKeys.
func VerifyCommit(c *object.Commit, keys *KeyRing) (*Signer, error) {
	subject := "commit " + c.Hash.String()
	return verifyObject(subject, c.PGPSignature, c.EncodeWithoutSignature, c.Verify, keys)
}

// VerifyTag verifies the signature of the annotated tag t against keys and returns the key
// that made it. Errors are ErrVerification (see Verify) or ErrInvalidKeys.
func VerifyTag(t *object.Tag, keys *KeyRing) (*Signer, error) {
	subject := fmt.Sprintf("tag %s (%s)", t.Name, t.Hash)
	return verifyObject(subject, t.PGPSignature, t.EncodeWithoutSignature, t.Verify, keys)
}

func verifyObject(subject, signature string, encode func(plumbing.EncodedObject) error,
	pgpVerify func(string) (*openpgp.Entity, error), keys *KeyRing) (*Signer, error) {
	if keys.Len() == 0 {
		return nil, &Error{Op: "verify", Subject: subject, Kind: ErrInvalidKeys, Err: errors.New("no trusted keys")}
	}
	fail := func(hint string, format string, args ...any) error {
		return &Error{Op: "verify", Subject: subject, Kind: ErrVerification, Err: fmt.Errorf(format, args...), Hint: hint}
	}
	sig := strings.TrimSpace(signature)
	switch {
	case sig == "":
		return nil, fail("sign it (git commit -S / git tag -s) with a trusted key", "not signed")
	case strings.HasPrefix(sig, sshSignaturePrefix):
		parsed, err := sshsig.Unarmor([]byte(sig))
		if err != nil {
			return nil, fail("", "malformed SSH signature: %v", err)
		}
		fp := ssh.FingerprintSHA256(parsed.PublicKey)
		for _, k := range keys.ssh {
			if k.fingerprint != fp {
				continue
			}
			obj := &plumbing.MemoryObject{}
			if err := encode(obj); err != nil {
				return nil, fail("", "encode without signature: %v", err)
			}
			r, err := obj.Reader()
			if err != nil {
				return nil, fail("", "encode without signature: %v", err)
			}
			if err := sshsig.Verify(r, parsed, k.key, parsed.HashAlgorithm, SSHNamespace); err != nil {
				if errors.Is(err, sshsig.ErrNamespaceMismatch) {
					return nil, fail("", "SSH signature by %s (%s) has namespace %q, not %q", fp, k.entry, parsed.Namespace, SSHNamespace)
				}
				return nil, fail("the object was altered after signing, or the signature is corrupt",
					"SSH signature by %s (%s) does not match the content: %v", fp, k.entry, err)
			}
			return &Signer{Type: SignatureSSH, Entry: k.entry, Fingerprint: fp}, nil
		}
		return nil, fail("add the signer's public key as NAME.sshpub to the verification secret if it is trusted",
			"signed by SSH key %s, which is not a trusted key", fp)
	case strings.HasPrefix(sig, pgpSignaturePrefix):
		var mismatch error
		var mismatchEntry string
		for _, k := range keys.pgp {
			entity, err := pgpVerify(k.armored)
			if err == nil {
				return &Signer{Type: SignatureOpenPGP, Entry: k.entry,
					Fingerprint: strings.ToUpper(hex.EncodeToString(entity.PrimaryKey.Fingerprint))}, nil
			}
			if !errors.Is(err, pgperrors.ErrUnknownIssuer) && mismatch == nil {
				mismatch, mismatchEntry = err, k.entry
			}
		}
		if mismatch != nil {
			return nil, fail("the object was altered after signing, the signature is corrupt, or the key expired",
				"OpenPGP signature does not verify with the key in %s: %v", mismatchEntry, mismatch)
		}
		return nil, fail("add the signer's public key as NAME.asc to the verification secret if it is trusted",
			"signed by OpenPGP key %s, which is not a trusted key", pgpIssuer(sig))
	default:
		return nil, fail("sign with an SSH (gpg.format=ssh) or OpenPGP key", "unsupported signature format (only SSH and OpenPGP signatures are supported)")
	}
}

// pgpIssuer names the key that made an armored OpenPGP signature, for error messages.
func pgpIssuer(sig string) string {
	block, err := armor.Decode(strings.NewReader(sig))
	if err != nil {
		return "(unreadable signature)"
	}
	p, err := packet.Read(block.Body)
	if err != nil {
		return "(unreadable signature)"
	}
	_, _ = io.Copy(io.Discard, block.Body)
	s, ok := p.(*packet.Signature)
	switch {
	case !ok:
		return "(unreadable signature)"
	case len(s.IssuerFingerprint) > 0:
		return strings.ToUpper(hex.EncodeToString(s.IssuerFingerprint))
	case s.IssuerKeyId != nil:
		return fmt.Sprintf("%016X", *s.IssuerKeyId)
	default:
		return "(no issuer)"
	}
}
