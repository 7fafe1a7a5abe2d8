package proxy

import (
	"context"
	"fmt"
	"time"

	"github.com/reversi-gitops/reversi/gateway/store"
)

// The gateway's alerts (issue 24): a refused reload, the kill switch turned on and off, and an
// upstream that went down are each journaled in the gateway-level journal with the alert
// (store.Event.Alert), so that the store writes the alert's notifications in the record's
// transaction: never a record without its alert, nor an alert without its record. (A
// rollback step that ends verification_failed or unrecoverable is announced by the store
// itself, in AppendRollback.) None of this is on the path of a tool call.

// alert is an alert of type typ about this gateway, with severity, a CamelCase reason and
// message (what happened and what to do).
func (g *Gateway) alert(typ, severity, reason, message string) *store.Notice {
	return &store.Notice{Type: typ, Object: &store.ObjectRef{Kind: store.ObjectGateway, Name: g.name}, Severity: severity,
		Reason: reason, Message: clip(message, maxNoteBytes), Revision: g.Digest()}
}

// journalAlert appends a gateway-level record (kind, note) that announces a (nil: none).
// Failures are said on stderr: the journal and the alert are both lost then, together.
func (g *Gateway) journalAlert(ctx context.Context, kind store.Kind, note string, a *store.Notice) {
	if _, err := g.store.AppendEvent(context.WithoutCancel(ctx), store.Event{Run: store.GatewayJournal, Kind: kind, Note: note,
		Alert: a}); err != nil {
		g.warn("journal %q: %v", note, err)
	}
}

// reloadRefusedAlert is the alert of a reload refused with err; revision is the checksum of
// the manifests that keep serving.
func (g *Gateway) reloadRefusedAlert(err error, revision string) *store.Notice {
	a := &store.Notice{Type: store.NoticeAlertReloadRefused, Object: &store.ObjectRef{Kind: store.ObjectGateway, Name: g.name},
		Severity: store.SeverityWarning, Reason: "ReloadRefused", Revision: revision,
		Message: clip(fmt.Sprintf("the gateway refused to reload its manifests: %v; the previous manifests (%s) and policy keep serving",
			err, revision), maxNoteBytes)}
	return a
}

// upstreamDown is the alert and journal note of upstream up whose session, begun at began,
// ended with werr; verb says what the gateway does about it; alert whether it is announced,
// quieted how many outages of up began since the last announced one without being announced.
func (g *Gateway) upstreamDown(up *upstream, werr error, began time.Time, verb string, alert bool, quieted int) {
	note := clip(fmt.Sprintf("upstream %s stopped (%v); %s", up.name, werr, verb), maxNoteBytes)
	g.warn("%s", note)
	var a *store.Notice
	if alert {
		more := ""
		if quieted > 0 {
			more = fmt.Sprintf(" It went down %d more times since the last alert about it (journaled, not announced: at most one alert per %s)", quieted, upstreamAlertQuiet)
		}
		a = g.alert(store.NoticeAlertUpstreamDown, store.SeverityCritical, "UpstreamDown",
			fmt.Sprintf("upstream %s went down at %s after %s up: %v. Calls to its tools are refused until it is back; the gateway is %s with backoff (up to %s between attempts).%s",
				up.name, time.Now().UTC().Format(time.RFC3339), time.Since(began).Round(time.Second), werr, verb, reconnectBackoff.Cap, more))
		a.Upstream, a.Since = up.name, began.UTC()
	}
	g.journalAlert(context.Background(), store.KindNote, note, a)
}
