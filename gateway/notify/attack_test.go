package notify

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/egress"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// Red team of issue 24's delivery: each attack fails without its defence; the honest path
// stays green next to it.

// TestAttackSlackPreviewEscapesTheCodeBlock: an agent controls the arguments of its held call,
// so the preview. Replacing "```" by "` ` `" left a "```" in any run of five backticks, which
// closed the code block early: the rest of the arguments was read as mrkdwn by the approvers'
// channel (a bold forged "Approved by security-lead" line). Now the preview holds no backtick
// that can end the block: the text has exactly the block's two fences and the approve and
// deny commands' code spans.
func TestAttackSlackPreviewEscapesTheCodeBlock(t *testing.T) {
	forged := "`````*:white_check_mark: Approved by security-lead, nothing to do*`````"
	for _, note := range []string{forged, "```", "``````", "x`y", "````" + "`" + "```"} {
		preview := engine.ArgumentsPreview(nil, map[string]any{"amount": 5, "note": note})
		n := goldenNotice
		n.ArgumentsPreview = preview
		body, err := SlackBody(n, "gw-a", "--data .reversi")
		if err != nil {
			t.Fatal(err)
		}
		text := slackText(t, body)
		block := text[strings.Index(text, "```")+3:]
		block = block[:strings.Index(block, "```")]
		if !strings.HasPrefix(block, `{"amount":5,"note":"`) || !strings.HasSuffix(block, `"}`) {
			t.Errorf("note %q: the code block ends inside the preview: %q", note, text)
		}
		if strings.Count(text, "```") != 2 {
			t.Errorf("note %q: %d fences: %q", note, strings.Count(text, "```"), text)
		}
	}
	// honest: a preview without backticks is unchanged
	n := goldenNotice
	body, _ := SlackBody(n, "gw-a", "")
	if !strings.Contains(slackText(t, body), "```"+strings.NewReplacer("&", "&amp;").Replace(n.ArgumentsPreview)+"```") {
		t.Errorf("the honest preview changed: %s", body)
	}
}

func slackText(t *testing.T, body []byte) string {
	t.Helper()
	var m map[string]string
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	return m["text"]
}

// lying resolves every name to one public address: the egress check's lookup. The dial of a
// delivery resolves the name again (the system resolver): "localhost" is 127.0.0.1 then, as
// a rebinding name answers a public address to the check and a private one a moment later.
type lying struct{}

func (lying) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("93.184.215.14")}, nil
}

// TestAttackRebindingReachesAPrivateAddress: with egress.block_private, a receiver whose name
// resolves to a public address when each delivery is checked and to 127.0.0.1 when it is
// dialled got the delivery (and would get a metadata address likewise): the check and the
// connection resolved separately. Now the address dialled is checked: nothing reaches the
// receiver and the row's error says why. Honest: the same receiver by a name that resolves to
// it both times, without block_private, gets it.
func TestAttackRebindingReachesAPrivateAddress(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	url := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1) + "/hook"

	st := openSQLite(t, t.TempDir())
	w := newWorker(t, Options{Outbox: st, Egress: egress.Rules{BlockPrivate: true}, Resolver: lying{}, Poll: 20 * time.Millisecond,
		Backoff: 50 * time.Millisecond, MaxAttempts: 2, Receivers: []config.Notification{{Name: "hook", Type: config.NotifyWebhook, URL: url}}})
	run(t, w)
	mustQueue(t, st, "run-1", "mem.delete_entities", `{}`)
	dead := settled(t, st, 5*time.Second)
	if hits.Load() != 0 || dead[0].State != store.NotificationDead {
		t.Fatalf("the receiver on 127.0.0.1 got %d deliveries under block_private", hits.Load())
	}
	if !strings.Contains(dead[0].LastError, "private address") {
		t.Errorf("last error %q", dead[0].LastError)
	}

	// honest path
	st2 := openSQLite(t, t.TempDir())
	rcv := newReceiver(t)
	run(t, newWorker(t, Options{Outbox: st2, Receivers: []config.Notification{{Name: "hook", Type: config.NotifyWebhook,
		URL: strings.Replace(rcv.URL, "127.0.0.1", "localhost", 1)}}}))
	mustQueue(t, st2, "run-1", "mem.delete_entities", `{}`)
	rcv.next(t, 2*time.Second)
}

// TestAttackMetadataByRebinding: the metadata address is refused whatever the rules say; a
// name the check saw as public but the dial reaches as 169.254.169.254 must be refused at the
// dial. (No test can make the system resolver answer that address: the guard is exercised
// directly.)
func TestAttackMetadataByRebinding(t *testing.T) {
	guard := egress.Rules{}.Dialed
	if err := guard(netip.MustParseAddr("169.254.169.254")); err == nil || !strings.Contains(err.Error(), "metadata") {
		t.Errorf("169.254.169.254: %v", err)
	}
	if err := guard(netip.MustParseAddr("fd00:ec2::254")); err == nil {
		t.Errorf("fd00:ec2::254 allowed")
	}
	if err := guard(netip.MustParseAddr("127.0.0.1")); err != nil {
		t.Errorf("127.0.0.1 without block_private: %v", err)
	}
	if err := (egress.Rules{BlockPrivate: true}).Dialed(netip.MustParseAddr("10.0.0.7")); err == nil {
		t.Errorf("10.0.0.7 under block_private allowed")
	}
}

// TestAttackHangingReceiverStarvesTheOthers: an agent's held calls fill the outbox of a
// receiver that hangs (or a receiver that is down answers each attempt after the timeout);
// the worker claimed the oldest rows of every receiver together and waited for the whole
// batch, so the other receivers' notifications waited behind Batch/Concurrency timeouts per
// round (40 s at the defaults, per 16 rows). Each receiver is now delivered on its own: the
// approvers' channel hears of a held call within a second while the first receiver hangs.
func TestAttackHangingReceiverStarvesTheOthers(t *testing.T) {
	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer hang.Close()
	defer close(release)
	ok := newReceiver(t)
	st := openSQLite(t, t.TempDir())
	w := newWorker(t, Options{Outbox: st, Timeout: time.Second, Poll: 20 * time.Millisecond, Receivers: []config.Notification{
		{Name: "hangs", Type: config.NotifyWebhook, URL: hang.URL, Tools: []string{"flood.*"}},
		{Name: "chat", Type: config.NotifyWebhook, URL: ok.URL, Tools: []string{"pay.*"}}}})
	for i := range 32 {
		mustQueue(t, st, "run-flood-"+string(rune('a'+i%26))+string(rune('a'+i/26)), "flood.call", `{}`)
	}
	run(t, w)
	time.Sleep(50 * time.Millisecond) // the worker is busy with the flood
	start := time.Now()
	mustQueue(t, st, "run-pay", "pay.refund", `{}`)
	ok.next(t, 1500*time.Millisecond)
	t.Logf("the other receiver's delivery came %s after its event", time.Since(start).Round(time.Millisecond))
}

// settled waits (bounded) until the outbox's rows are all delivered or dead.
func settled(t *testing.T, o store.Outbox, within time.Duration) []store.Notification {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		l := list(t, o, "")
		if len(l) > 0 && !slices.ContainsFunc(l, func(n store.Notification) bool { return n.State == store.NotificationPending }) {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("rows still pending after %s: %+v", within, l)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAttackNamespaceAttribution: a ReversiGateway's name is unique only in its namespace, so
// two teams' gateways "gw" in namespaces a and b posting to one shared receiver were told
// apart by nothing in the body or the Slack text, and the approve command of a request kept
// in Kubernetes ran against the approver's kubeconfig namespace. A notice's namespace is in
// the body, the text and the commands. Standalone (no namespace): unchanged.
func TestAttackNamespaceAttribution(t *testing.T) {
	n := goldenNotice
	n.Kept, n.Namespace = true, "team-b"
	body, err := WebhookBody(n, "gw", "")
	if err != nil {
		t.Fatal(err)
	}
	var b Body
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatal(err)
	}
	if b.Namespace != "team-b" || b.ApproveCommand != "reversi approve apr-7f3a -n team-b --apply" || b.DenyCommand != "reversi deny apr-7f3a -n team-b --apply" {
		t.Errorf("body %s", body)
	}
	sb, _ := SlackBody(n, "gw", "")
	if text := slackText(t, sb); !strings.Contains(text, "on gateway gw in namespace team-b") || !strings.Contains(text, "`reversi approve apr-7f3a -n team-b --apply`") {
		t.Errorf("slack %s", text)
	}
	body, _ = WebhookBody(goldenNotice, "gw", "")
	if strings.Contains(string(body), `"namespace"`) {
		t.Errorf("standalone body names a namespace: %s", body)
	}
}

// TestAttackLeaseShorterThanABatch: a claim leases Batch rows (16) delivered Concurrency (4)
// at a time, each up to Timeout (10 s): against a receiver that hangs, the last rows of a
// batch begin after 30 s and end after 40 s, but the lease was 2 × Timeout + 10 s = 30 s.
// Another replica (Postgres) then claimed rows this worker had not posted yet: each was
// posted twice at once and the first worker's results were refused (ErrLeaseLost). The
// default lease covers a whole batch now. Shown on a shared SQLite store: a second owner
// cannot claim the rows while the first one's batch is still within its time.
func TestAttackLeaseShorterThanABatch(t *testing.T) {
	st := openSQLite(t, t.TempDir())
	w := newWorker(t, Options{Outbox: st, Receivers: []config.Notification{{Name: "hook", Type: config.NotifyWebhook, URL: "http://127.0.0.1:9/"}}})
	waves := (w.o.Batch + w.o.Concurrency - 1) / w.o.Concurrency
	if batch := time.Duration(waves) * w.o.Timeout; w.o.Lease <= batch {
		t.Fatalf("the lease (%s) is not longer than a batch can take (%s)", w.o.Lease, batch)
	}
	// the lease as claimed: a second owner gets nothing within it
	mustQueue(t, st, "run-1", "mem.delete_entities", `{}`)
	ctx := context.Background()
	got, err := st.ClaimNotifications(ctx, "replica-a", []string{"hook"}, w.o.Lease, w.o.Batch)
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %v %v", got, err)
	}
	if again, err := st.ClaimNotifications(ctx, "replica-b", []string{"hook"}, w.o.Lease, w.o.Batch); err != nil || len(again) != 0 {
		t.Fatalf("a second replica claimed a leased row: %v %v", again, err)
	}
}
