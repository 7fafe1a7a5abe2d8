package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/reversi-gitops/reversi/gateway/store"
)

// NotificationReportInterval is how often a pod reads its outbox's summary for its report
// (ReportNotifications): three bounded queries each time, a Lease write only on a change.
const NotificationReportInterval = 2 * time.Second

// NotificationReportOptions configure Manifests.ReportNotifications.
type NotificationReportOptions struct {
	// Outbox summarizes the store's notification outbox: the SQL store itself (SQLite,
	// Postgres, Memory), not a wrapper. Required.
	Outbox store.NotificationSummarizer
	// Receivers are the names of the configured receivers: only their rows are counted (the
	// dead letters of a receiver removed from the spec are left out). Required: without
	// receivers there is nothing to report.
	Receivers []string
	// Redact are values that must never reach the Lease (the receivers' URLs and HMAC keys):
	// each is replaced by "<redacted>" in the last dead letter's error. The delivery errors
	// already leave the URL out (pkg/webhook); this holds even for one that would not.
	Redact []string
	// Interval between two reads (default NotificationReportInterval).
	Interval time.Duration
}

// ReportNotifications reports the summary of the pod's notification outbox on its Lease
// (issue 24: dead letters "visible (`reversi notifications list`, a metric, a condition)"),
// as the annotations reversi.dev/notifications-dead, -retrying and -last-dead, for the
// ReversiGateway controller's NotificationsDelivered condition. It reads the summary at once
// and then every Interval until ctx ends; the Lease is written (with the manifest report, by
// the same reporter and its backoff) only when the summary changes. A read that fails keeps
// the last summary and is logged once per distinct error. Without a PodName it returns nil at
// once. Errors: no Outbox or no Receivers.
// Source: issue 24.
func (m *Manifests) ReportNotifications(ctx context.Context, o NotificationReportOptions) error {
	if o.Outbox == nil || len(o.Receivers) == 0 {
		return errors.New("kube: a notification report needs the store's outbox and the receivers' names")
	}
	if m.rep == nil {
		return nil
	}
	if o.Interval <= 0 {
		o.Interval = NotificationReportInterval
	}
	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
	failing := ""
	for {
		sum, err := o.Outbox.SummarizeNotifications(ctx, o.Receivers)
		switch {
		case err != nil && ctx.Err() != nil:
			return nil
		case err != nil:
			if msg := err.Error(); msg != failing {
				m.o.Logf("reversi-gateway: reading the notification outbox for the report on Lease %s/%s (retrying every %s): %v", m.o.Namespace, m.o.PodName, o.Interval, err)
				failing = msg
			}
		default:
			failing = ""
			m.rep.setNotes(notesOf(sum, o.Redact))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// notesOf is the report of a summary: the newest dead letter as "<receiver>: <error>
// (<idempotency key>)" with every value of redact replaced, cut to maxReportDeadLetter bytes.
func notesOf(sum store.NotificationSummary, redact []string) notesReport {
	n := notesReport{reported: true, dead: sum.Dead, retrying: sum.Retrying}
	if d := sum.LastDead; d != nil {
		text := fmt.Sprintf("%s: %s (%s)", d.Sink, d.LastError, d.Notice.Key)
		for _, v := range redact {
			if v != "" {
				text = strings.ReplaceAll(text, v, "<redacted>")
			}
		}
		n.lastDead = cut(text, maxReportDeadLetter)
	}
	return n
}
