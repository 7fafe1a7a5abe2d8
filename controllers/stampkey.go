package controllers

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// The Approval stamp key: an HMAC-SHA256 key in a Secret of the controller's namespace
// (`reversi controller --stamp-key-secret`), created on first start. Only the controller reads
// it; with it the Approval webhook seals each Approval it admitted, and the ApprovalRequest
// reconciler counts only sealed Approvals (issue 16: counting fails closed without the webhook).
const (
	DefaultStampKeySecret = "reversi-approval-stamp-key"
	// StampKeyData is the Secret key of the current stamp key (32 random bytes or more). Every
	// other entry of the Secret is an earlier key: it verifies stamps made with it but stamps
	// nothing (rotation: move stamp.key to another entry, put a new key in stamp.key).
	StampKeyData = "stamp.key"
	// StampKeyMinBytes is the shortest stamp key accepted.
	StampKeyMinBytes = 32
	// StampMaxSkew is how far an Approval's creationTimestamp may be from its stamp's time: a
	// stamp copied onto a later Approval fails.
	StampMaxSkew = time.Minute
	// stampDomain starts every stamped message (its version is part of the message).
	stampDomain = "reversi-approval-stamp:v1"
)

// StampKey holds the current key (which stamps) and earlier keys (which only verify), by ID.
type StampKey struct {
	id   string
	keys map[string][]byte
}

// StampKeyID is a key's ID: the first 16 hex digits of its SHA-256.
func StampKeyID(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:8])
}

// NewStampKey builds a StampKey from the current key and earlier ones. Errors: a key shorter
// than StampKeyMinBytes.
func NewStampKey(current []byte, earlier ...[]byte) (*StampKey, error) {
	k := &StampKey{id: StampKeyID(current), keys: map[string][]byte{}}
	for i, b := range append([][]byte{current}, earlier...) {
		if len(b) < StampKeyMinBytes {
			if i == 0 {
				return nil, fmt.Errorf("the current stamp key has %d bytes, want at least %d", len(b), StampKeyMinBytes)
			}
			return nil, fmt.Errorf("earlier stamp key %d has %d bytes, want at least %d", i, len(b), StampKeyMinBytes)
		}
		k.keys[StampKeyID(b)] = slices.Clone(b)
	}
	return k, nil
}

// EphemeralStampKey is a new key kept in memory only, for managers run in tests' own processes
// (Options.StampKey nil): Approvals stamped by another process are not counted.
func EphemeralStampKey() (*StampKey, error) {
	b := make([]byte, StampKeyMinBytes)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	return NewStampKey(b)
}

// ID is the ID of the current key (ApprovalStamp.KeyID of new stamps).
func (k *StampKey) ID() string { return k.id }

// stampMessage is what the MAC covers, one field a line (design of issue 16):
//
//	reversi-approval-stamp:v1, namespace, name, request name, request uid, decision,
//	username, uid, sorted groups joined by ",", at (RFC 3339, seconds, UTC).
func stampMessage(a *v1alpha1.Approval, at time.Time) []byte {
	var user, uid string
	var groups []string
	if a.Spec.Approver != nil {
		user, uid = a.Spec.Approver.Username, a.Spec.Approver.UID
		groups = slices.Clone(a.Spec.Approver.Groups)
	}
	slices.Sort(groups)
	return []byte(strings.Join([]string{stampDomain, a.Namespace, a.Name, a.Spec.RequestRef.Name, a.Spec.RequestRef.UID,
		a.Spec.Decision, user, uid, strings.Join(slices.Compact(groups), ","), at.UTC().Format(time.RFC3339)}, "\n"))
}

func (k *StampKey) mac(key []byte, a *v1alpha1.Approval, at time.Time) []byte {
	h := hmac.New(sha256.New, key)
	h.Write(stampMessage(a, at))
	return h.Sum(nil)
}

// Stamp seals a (its namespace, name, requestRef, decision and approver as they are now) with
// the current key at time at (truncated to seconds).
func (k *StampKey) Stamp(a *v1alpha1.Approval, at time.Time) *v1alpha1.ApprovalStamp {
	at = at.UTC().Truncate(time.Second)
	return &v1alpha1.ApprovalStamp{At: metav1.NewTime(at), KeyID: k.id,
		MAC: base64.RawURLEncoding.EncodeToString(k.mac(k.keys[k.id], a, at))}
}

// sealDomain starts every sealed status.
const sealDomain = "reversi-approval-status-seal:v1"

// sealMessage is what a status seal covers: the request's identity (namespace, name, uid, spec
// digest) and its decision state as JSON (phase, counted and rejected Approvals, counts,
// decidedAt, escalatedAt; times in RFC 3339 seconds, as the API server keeps them).
func sealMessage(ar *v1alpha1.ApprovalRequest) ([]byte, error) {
	st := ar.Status
	state, err := json.Marshal(struct {
		Phase         string                      `json:"phase"`
		Approvals     []v1alpha1.CountedApproval  `json:"approvals"`
		ApprovedCount int32                       `json:"approvedCount"`
		Rejected      []v1alpha1.RejectedApproval `json:"rejected"`
		RejectedCount int32                       `json:"rejectedCount"`
		DecidedAt     *metav1.Time                `json:"decidedAt"`
		EscalatedAt   *metav1.Time                `json:"escalatedAt"`
	}{st.Phase, st.Approvals, st.ApprovedCount, st.Rejected, st.RejectedCount, st.DecidedAt, st.EscalatedAt})
	if err != nil {
		return nil, err
	}
	return []byte(strings.Join([]string{sealDomain, ar.Namespace, ar.Name, string(ar.UID), ar.Spec.Digest(), string(state)}, "\n")), nil
}

// Seal is the status seal of ar as it is now, with the current key ("" if ar cannot be
// encoded, which never happens for plain data).
func (k *StampKey) Seal(ar *v1alpha1.ApprovalRequest) string {
	m, err := sealMessage(ar)
	if err != nil {
		return ""
	}
	h := hmac.New(sha256.New, k.keys[k.id])
	h.Write(m)
	return k.id + ":" + base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// Sealed reports whether ar's status is one the controller wrote: empty (never decided on), or
// carrying a seal by a known key over exactly its decision state.
func (k *StampKey) Sealed(ar *v1alpha1.ApprovalRequest) bool {
	st := ar.Status
	if st.Seal == "" {
		return st.Phase == "" && len(st.Approvals) == 0 && len(st.Rejected) == 0 && st.ApprovedCount == 0 &&
			st.RejectedCount == 0 && st.DecidedAt == nil && st.EscalatedAt == nil && st.Decision == nil
	}
	id, mac, ok := strings.Cut(st.Seal, ":")
	key, known := k.keys[id]
	got, err := base64.RawURLEncoding.DecodeString(mac)
	m, merr := sealMessage(ar)
	if !ok || !known || err != nil || merr != nil {
		return false
	}
	h := hmac.New(sha256.New, key)
	h.Write(m)
	return hmac.Equal(got, h.Sum(nil))
}

// StampError says why an Approval's stamp does not verify.
type StampError struct {
	// Approval is namespace/name.
	Approval string
	Why      string
}

func (e *StampError) Error() string {
	return fmt.Sprintf("Approval %s carries no valid stamp of the Approval webhook: %s", e.Approval, e.Why)
}

// Verify checks a's stamp: present, made with a known key, the MAC right over a as it is,
// and a's creationTimestamp (when set) within StampMaxSkew of the stamp's time. Errors:
// *StampError.
func (k *StampKey) Verify(a *v1alpha1.Approval) error {
	fail := func(format string, args ...any) error {
		return &StampError{Approval: a.Namespace + "/" + a.Name, Why: fmt.Sprintf(format, args...)}
	}
	s := a.Spec.Stamp
	if s == nil {
		return fail("spec.stamp is missing")
	}
	key, ok := k.keys[s.KeyID]
	if !ok {
		return fail("spec.stamp.keyID %q is not a key of the controller", s.KeyID)
	}
	got, err := base64.RawURLEncoding.DecodeString(s.MAC)
	if err != nil || !hmac.Equal(got, k.mac(key, a, s.At.Time)) {
		return fail("spec.stamp.mac does not match the Approval's namespace, name, request, decision and approver")
	}
	if ct := a.CreationTimestamp.Time; !ct.IsZero() {
		if d := ct.Sub(s.At.Time); d > StampMaxSkew || d < -StampMaxSkew {
			return fail("the Approval was created at %s but stamped at %s", ct.UTC().Format(time.RFC3339), s.At.UTC().Format(time.RFC3339))
		}
	}
	return nil
}

// EnsureStampKey reads the stamp key from the Secret ref, creating the Secret with 32 random
// bytes in StampKeyData when it does not exist (first start; a concurrent creator wins and its
// key is read). Use a client that reads the API server directly (the manager's cache is not
// started yet). Errors: the Secret cannot be read or created (RBAC: get and create on that
// Secret), or holds no usable key (an error naming the Secret and what to put in it).
func EnsureStampKey(ctx context.Context, c client.Client, ref types.NamespacedName) (*StampKey, error) {
	var s corev1.Secret
	err := c.Get(ctx, ref, &s)
	if apierrors.IsNotFound(err) {
		b := make([]byte, StampKeyMinBytes)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		s = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name, Labels: map[string]string{LabelManagedBy: ManagedBy}},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{StampKeyData: b},
		}
		err = c.Create(ctx, &s)
		if apierrors.IsAlreadyExists(err) {
			err = c.Get(ctx, ref, &s)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("the Approval stamp key Secret %s: %w", ref, err)
	}
	var earlier [][]byte
	names := make([]string, 0, len(s.Data))
	for n := range s.Data {
		if n != StampKeyData {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		earlier = append(earlier, s.Data[n])
	}
	key, err := NewStampKey(s.Data[StampKeyData], earlier...)
	if err != nil {
		return nil, fmt.Errorf("the Approval stamp key Secret %s: %w: put %d or more random bytes in %q (head -c 32 /dev/urandom), or delete the Secret to get a new key (Approvals stamped with the old one then stop verifying unless it stays as another entry)", ref, err, StampKeyMinBytes, StampKeyData)
	}
	return key, nil
}
