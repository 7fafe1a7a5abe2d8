package kube

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// The gateway's alerts as Kubernetes Events (issue 24: "Kubernetes Events on the objects
// concerned"). An alert journaled by the gateway (a refused reload, the kill switch turned on
// or off, an upstream down: store.Event.Alert) is also an Event on its ReversiGateway: type
// Warning (Normal for the kill switch turned off), the alert's reason, action "Alert", its
// message as the note (cut to the API's 1 KiB). (A rollback step that ends
// verification_failed or unrecoverable shows in its ReversiRun's status.) They are recorded
// after the journal write committed, by the recorder of Options.Events, which drops what it
// cannot send: Events are for people; the outbox is what never loses an alert.

// eventNoteBytes bounds an Event's note (the API refuses longer notes).
const eventNoteBytes = 1024

// AppendEvent implements store.Store: the inner store's, then the Event of e's alert.
func (s *Store) AppendEvent(ctx context.Context, e store.Event) (int64, error) {
	seq, err := s.Store.AppendEvent(ctx, e)
	if err == nil && e.Alert != nil && s.recorder != nil {
		s.alertEvent(e.Alert)
	}
	return seq, err
}

// alertEvent records the Event of a gateway alert on the gateway's ReversiGateway.
func (s *Store) alertEvent(a *store.Notice) {
	if s.o.Gateway == "" {
		return
	}
	obj := &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: s.o.Namespace, Name: s.o.Gateway}}
	typ := corev1.EventTypeWarning
	if a.Type == store.NoticeAlertResumed {
		typ = corev1.EventTypeNormal
	}
	reason := a.Reason
	if reason == "" {
		reason = "Alert"
	}
	s.recorder.Eventf(obj, nil, typ, reason, "Alert", "%s", cut(a.Message, eventNoteBytes))
}
