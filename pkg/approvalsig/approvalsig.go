// Package approvalsig signs and verifies the controller's decision on an ApprovalRequest
// (status.decision): the controller signs an Approved phase with its Ed25519 key
// (controllers.SigningKey), the gateway lets a held call through only when the signature
// verifies with one of the controller's public keys ($REVERSI_CONTROLLER_KEYS). Whoever may
// write approvalrequests/status (with the webhook rule for it removed, or the webhook gone)
// can write a phase, but not a signature.
//
// The message covers exactly one object and one decision:
//
//	reversi-approval-decision:v1
//	<namespace>
//	<name>
//	<uid>
//	<spec digest>          (v1alpha1.ApprovalRequestSpec.Digest)
//	<phase>
//	<decidedAt, RFC 3339>
//	<the sorted distinct usernames of status.approvals that approved, joined by ",">
//
// (lines joined by "\n", no final newline), so a signature copied onto another request, a
// replaced object of the same name, an edited spec or other approvers does not verify.
//
// Source: issue 16 (review: "the gateway believes any ApprovalRequest status.phase").
package approvalsig

import (
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// Version is the first line of every message.
const Version = "reversi-approval-decision:v1"

// Approvers are the distinct usernames of ar's status.approvals whose decision is Approve,
// sorted.
func Approvers(ar *v1alpha1.ApprovalRequest) []string {
	var by []string
	for _, c := range ar.Status.Approvals {
		if c.Decision == v1alpha1.DecisionApprove && c.Username != "" {
			by = append(by, c.Username)
		}
	}
	slices.Sort(by)
	return slices.Compact(by)
}

// Message is the byte string a decision signature of ar covers (see the package comment).
func Message(ar *v1alpha1.ApprovalRequest) []byte {
	decided := ""
	if ar.Status.DecidedAt != nil {
		decided = ar.Status.DecidedAt.UTC().Format(time.RFC3339)
	}
	return []byte(strings.Join([]string{Version, ar.Namespace, ar.Name, string(ar.UID), ar.Spec.Digest(),
		ar.Status.Phase, decided, strings.Join(Approvers(ar), ",")}, "\n"))
}

// Sign signs ar's decision as it stands (its status phase, decidedAt and approvals) with the
// controller's key.
func Sign(ar *v1alpha1.ApprovalRequest, s *signing.Signer, now time.Time) (*v1alpha1.SignedDecision, error) {
	sig, err := s.Sign(Message(ar))
	if err != nil {
		return nil, err
	}
	at := metav1.NewTime(now)
	return &v1alpha1.SignedDecision{KeyID: s.KeyID, Signature: base64.StdEncoding.EncodeToString(sig), SignedAt: &at}, nil
}

// ErrUnsigned is wrapped by Verify when ar carries no decision signature at all.
var ErrUnsigned = errors.New("no decision signature (status.decision) of the controller")

// Verify checks that ar is Approved as the controller decided it: status.decision is a
// signature by a key of controller over Message(ar), and status.approvals holds at least the
// spec's quorum of distinct approving usernames. Errors say why in words (ErrUnsigned when
// there is no signature; signing.ErrUntrusted for a key that is not the controller's).
func Verify(ar *v1alpha1.ApprovalRequest, controller *signing.TrustSet) error {
	if ar.Status.Phase != v1alpha1.ApprovalApproved {
		return fmt.Errorf("phase %q is not %s", ar.Status.Phase, v1alpha1.ApprovalApproved)
	}
	if controller == nil {
		return errors.New("no controller keys to verify the decision with")
	}
	d := ar.Status.Decision
	if d == nil || (d.KeyID == "" && d.Signature == "") {
		return ErrUnsigned
	}
	if ar.Status.DecidedAt == nil {
		return errors.New("an Approved phase without decidedAt")
	}
	quorum := 1
	if ar.Spec.Quorum != nil {
		quorum = max(int(*ar.Spec.Quorum), 1)
	}
	if by := Approvers(ar); len(by) < quorum {
		return fmt.Errorf("status.approvals names %d distinct approver(s) %v, below the quorum of %d", len(by), by, quorum)
	}
	sig, err := base64.StdEncoding.DecodeString(d.Signature)
	if err != nil || d.KeyID == "" {
		return errors.New("the decision signature or its key id is malformed")
	}
	if err := controller.Verify(d.KeyID, sig, Message(ar)); err != nil {
		if errors.Is(err, signing.ErrUntrusted) {
			return fmt.Errorf("the decision is signed by key %s, which is not one of the controller's (%v)", d.KeyID, controller.KeyIDs())
		}
		return fmt.Errorf("the decision signature (key %s) does not verify over this request's uid, spec, phase, decidedAt and approvers: it was made for another request or decision, or the status was edited", d.KeyID)
	}
	return nil
}
