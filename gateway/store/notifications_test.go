package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// receivers are "hook" (every notice) and "chat" (the tools mem.*: not quiet.delete).
var receivers = []Receiver{{Name: "hook"}, {Name: "chat", Tools: []string{"mem.*"}}}

// sinks are the receivers' names (what a worker that knows both claims).
var sinks = []string{"hook", "chat"}

func outboxOf(t *testing.T, s Store) Outbox {
	t.Helper()
	o, ok := s.(Outbox)
	if !ok {
		t.Fatalf("%T is not an Outbox", s)
	}
	return o
}

func noErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// woke reports whether the wake channel has a signal waiting.
func woke(o Outbox) bool {
	select {
	case <-o.NotificationWake():
		return true
	default:
		return false
	}
}

// TestNotificationOutbox: the rows a request and its decision write (one per receiver the
// router names, with the idempotency key, the redacted preview and the risk), the lease that
// keeps a row to one worker, retries, delivery, dead letters, the expiry sweep, and that the
// rows outlive a restart. Source: issue 24 ("an outbox in the store written in the same
// transaction as the event").
func TestNotificationOutbox(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, clock *fakeClock) {
		ctx := context.Background()
		o := outboxOf(t, s)
		must[Run](t)(s.CreateRun(ctx, Run{ID: "r1", Actor: "alice"}))
		req := ApprovalRequest{Tool: "mem.delete", ArgsDigest: "sha256:1", Run: "r1", Actor: "alice", Roles: []string{"finance"},
			Quorum: 1, Expires: clock.Now().Add(time.Hour), Reason: "irreversible", ArgsPreview: `{"card":"[redacted]","name":"bob"}`,
			Risk: Risk{BlastRadius: "high", DataClass: "pii"}}

		// No receivers: nothing is written.
		a0 := must[Approval](t)(s.CreateApproval(ctx, req))
		if l := must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{})); len(l) != 0 || woke(o) {
			t.Fatalf("rows without receivers: %+v", l)
		}
		noErr(t, o.SetNotificationReceivers(ctx, receivers))
		a := must[Approval](t)(s.CreateApproval(ctx, req))
		if !woke(o) {
			t.Fatal("no wake-up after a request with notifications")
		}
		quiet := req
		quiet.Tool = "quiet.delete"
		q := must[Approval](t)(s.CreateApproval(ctx, quiet))
		all := must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{}))
		if len(all) != 3 {
			t.Fatalf("rows %+v, want hook and chat for %s and hook for %s", all, a.ID, q.ID)
		}
		for _, n := range all[:2] {
			want := Notice{Type: NoticeApprovalRequested, Key: "approval.requested:" + a.ID, At: a.Created, Approval: a.ID,
				Tool: "mem.delete", Run: "r1", Actor: "alice", Reason: "irreversible", ArgumentsPreview: req.ArgsPreview,
				Risk: req.Risk, Roles: []string{"finance"}, Quorum: 1, Expires: a.Expires}
			if fmt.Sprintf("%+v", n.Notice) != fmt.Sprintf("%+v", want) || n.State != NotificationPending || n.Attempts != 0 {
				t.Fatalf("row %+v\nwant notice %+v", n, want)
			}
		}
		if all[2].Sink != "hook" || all[2].Notice.Approval != q.ID {
			t.Fatalf("the quiet tool's row %+v", all[2])
		}
		if g := must[Approval](t)(s.GetApproval(ctx, a.ID)); g.ArgsPreview != req.ArgsPreview || g.Risk != req.Risk {
			t.Fatalf("stored request %+v: preview and risk not kept", g)
		}
		_ = a0

		// Leases: one worker gets the rows; another gets none while the lease holds.
		got := must[[]Notification](t)(o.ClaimNotifications(ctx, "w1", sinks, time.Minute, 10))
		if len(got) != 3 {
			t.Fatalf("claimed %d, want 3", len(got))
		}
		if l := must[[]Notification](t)(o.ClaimNotifications(ctx, "w2", sinks, time.Minute, 10)); len(l) != 0 {
			t.Fatalf("w2 claimed leased rows %+v", l)
		}
		first := got[0]
		// A failed attempt: pending again, due later, with its error.
		if err := o.FinishNotification(ctx, first.ID, "w1", NotificationPending, clock.Now().Add(2*time.Second), "HTTP 500"); err != nil {
			t.Fatal(err)
		}
		if err := o.FinishNotification(ctx, first.ID, "w1", NotificationDelivered, time.Time{}, ""); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("finishing a row no longer leased: %v", err)
		}
		if l := must[[]Notification](t)(o.ClaimNotifications(ctx, "w2", sinks, time.Minute, 10)); len(l) != 0 {
			t.Fatalf("claimed before the retry is due: %+v", l)
		}
		clock.Advance(3 * time.Second)
		retry := must[[]Notification](t)(o.ClaimNotifications(ctx, "w2", sinks, time.Minute, 10))
		if len(retry) != 1 || retry[0].ID != first.ID || retry[0].Attempts != 1 || retry[0].LastError != "HTTP 500" {
			t.Fatalf("retry claimed %+v", retry)
		}
		noErr(t, o.FinishNotification(ctx, first.ID, "w2", NotificationDelivered, time.Time{}, ""))
		// An expired lease: the row goes to another worker, and the first one's result is refused.
		clock.Advance(2 * time.Minute)
		taken := must[[]Notification](t)(o.ClaimNotifications(ctx, "w3", sinks, time.Minute, 10))
		if len(taken) != 2 {
			t.Fatalf("after the lease expired w3 claimed %+v", taken)
		}
		if err := o.FinishNotification(ctx, taken[0].ID, "w1", NotificationDelivered, time.Time{}, ""); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("w1 finishing a row w3 took over: %v", err)
		}
		noErr(t, o.FinishNotification(ctx, taken[0].ID, "w3", NotificationDead, time.Time{}, "HTTP 404"))
		noErr(t, o.FinishNotification(ctx, taken[1].ID, "w3", NotificationDelivered, time.Time{}, ""))

		del := must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{State: NotificationDelivered}))
		dead := must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{State: NotificationDead}))
		if len(del) != 2 || len(dead) != 1 || dead[0].LastError != "HTTP 404" || dead[0].Attempts != 1 {
			t.Fatalf("delivered %+v dead %+v", del, dead)
		}
		for _, n := range del {
			if n.Delivered.IsZero() || n.LastError != "" {
				t.Fatalf("delivered row %+v", n)
			}
		}
		if n := del[slices.IndexFunc(del, func(n Notification) bool { return n.ID == first.ID })]; n.Attempts != 2 {
			t.Fatalf("attempts %d, want 2", n.Attempts)
		}
		_, err := o.ListNotifications(ctx, NotificationFilter{State: "lost"})
		wantErr(t, err, ErrInvalid)

		// The decision: approval.approved, in Decide's transaction, naming who decided.
		must[Approval](t)(s.Decide(ctx, a.ID, Decision{By: "bob", Roles: []string{"finance"}, Approve: true}))
		approved := must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{Sink: "chat", State: NotificationPending}))
		if len(approved) != 1 || approved[0].Notice.Type != NoticeApprovalApproved || approved[0].Notice.Key != "approval.approved:"+a.ID ||
			!slices.Equal(approved[0].Notice.DecidedBy, []string{"bob"}) {
			t.Fatalf("after approve: %+v", approved)
		}

		// Expiry: SettleApprovals writes the phase, its record and its notice, once.
		clock.Advance(2 * time.Hour)
		if n := must[int](t)(o.SettleApprovals(ctx, 0)); n != 2 { // a0 and q (a is approved)
			t.Fatalf("settled %d, want 2", n)
		}
		if n := must[int](t)(o.SettleApprovals(ctx, 0)); n != 0 {
			t.Fatalf("settled %d again", n)
		}
		exp := must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{Sink: "hook", State: NotificationPending}))
		var types []string
		for _, n := range exp {
			types = append(types, n.Notice.Type+":"+n.Notice.Approval)
		}
		slices.Sort(types)
		want := []string{"approval.approved:" + a.ID, "approval.expired:" + a0.ID, "approval.expired:" + q.ID}
		slices.Sort(want)
		if !slices.Equal(types, want) {
			t.Fatalf("hook's pending rows %v, want %v", types, want)
		}
		var expired int
		for _, r := range must[[]Record](t)(s.Records(ctx, "r1", 0, 0)) {
			if r.Kind == KindApproval && r.Event == EventExpired {
				expired++
			}
		}
		if expired != 2 {
			t.Fatalf("%d expired records, want 2", expired)
		}
		if g := must[Approval](t)(s.GetApproval(ctx, q.ID)); g.State != ApprovalExpired {
			t.Fatalf("q is %s", g.State)
		}

		// A restart keeps the rows (for SQLite and Postgres; Memory is kept as it is).
		s2 := restart(t, s)
		o2 := outboxOf(t, s2)
		if l := must[[]Notification](t)(o2.ListNotifications(ctx, NotificationFilter{State: NotificationPending})); len(l) != 5 {
			t.Fatalf("pending after restart: %d rows, want 5", len(l))
		}
		// The receivers are stored: another instance (the CLI deciding, a replica) that never
		// set them routes the same way.
		req.Expires = clock.Now().Add(time.Hour)
		b := must[Approval](t)(s2.CreateApproval(ctx, req))
		if l := must[[]Notification](t)(o2.ListNotifications(ctx, NotificationFilter{State: NotificationPending})); len(l) != 7 ||
			l[5].Notice.Approval != b.ID || l[6].Notice.Approval != b.ID {
			t.Fatalf("pending after a request of the new instance: %+v", l)
		}
		// A worker claims only the rows of the receivers it knows.
		chat := must[[]Notification](t)(o2.ClaimNotifications(ctx, "w9", []string{"chat"}, time.Minute, 10))
		if len(chat) != 3 || slices.ContainsFunc(chat, func(n Notification) bool { return n.Sink != "chat" }) {
			t.Fatalf("chat's claim %+v", chat)
		}
		// Receivers replaced: the pending rows of the one removed are dead, with why.
		noErr(t, o2.SetNotificationReceivers(ctx, []Receiver{{Name: "hook"}}))
		if l := must[[]Notification](t)(o2.ListNotifications(ctx, NotificationFilter{State: NotificationPending, Sink: "chat"})); len(l) != 0 {
			t.Fatalf("chat still pending: %+v", l)
		}
		gone := must[[]Notification](t)(o2.ListNotifications(ctx, NotificationFilter{State: NotificationDead, Sink: "chat"}))
		removed := 0 // and the one dead with HTTP 404 above, when it was chat's
		for _, n := range gone {
			if n.LastError == "the receiver is no longer configured" {
				removed++
			}
		}
		if removed != 3 {
			t.Fatalf("chat's rows %+v", gone)
		}
		must[Approval](t)(s2.CreateApproval(ctx, req))
		if l := must[[]Notification](t)(o2.ListNotifications(ctx, NotificationFilter{State: NotificationPending})); len(l) != 5 {
			t.Fatalf("pending %d, want hook's 4 and the new request's one", len(l))
		}
		wantErr(t, o2.SetNotificationReceivers(ctx, []Receiver{{Name: "a"}, {Name: "a"}}), ErrInvalid)
	})
}

// TestNotificationRowsFollowTheirEvent: a notification exists only if its event committed:
// a request refused (ErrExists: its id is taken) and a decision refused by the rules (the
// actor approving) announce nothing.
func TestNotificationRowsFollowTheirEvent(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, clock *fakeClock) {
		ctx := context.Background()
		o := outboxOf(t, s)
		noErr(t, o.SetNotificationReceivers(ctx, receivers))
		must[Run](t)(s.CreateRun(ctx, Run{ID: "r1", Actor: "alice"}))
		req := ApprovalRequest{ID: "apr-1", Tool: "mem.delete", Run: "r1", Actor: "alice", Expires: clock.Now().Add(time.Hour)}
		must[Approval](t)(s.CreateApproval(ctx, req))
		_, err := s.CreateApproval(ctx, req)
		wantErr(t, err, ErrExists)
		_, err = s.Decide(ctx, "apr-1", Decision{By: "alice", Approve: true})
		wantErr(t, err, ErrNotAllowed)
		l := must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{}))
		if len(l) != 2 || l[0].Notice.Type != NoticeApprovalRequested || l[1].Notice.Type != NoticeApprovalRequested {
			t.Fatalf("rows %+v, want the one request's two", l)
		}
	})
}

// TestPostgresClaimsAcrossReplicas: two stores on one schema (two gateway replicas) claim the
// same due rows at once, over and over: every row is claimed by exactly one of them.
func TestPostgresClaimsAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	url := pgURL("")
	a, b := openPG(t, url, nil), openPG(t, url, nil)
	if err := a.SetNotificationReceivers(ctx, []Receiver{{Name: "hook"}}); err != nil {
		t.Fatal(err)
	}
	must[Run](t)(a.CreateRun(ctx, Run{ID: "r1", Actor: "alice"}))
	const n = 60
	for i := range n {
		must[Approval](t)(a.CreateApproval(ctx, ApprovalRequest{Tool: fmt.Sprintf("t%d", i), Run: "r1", Actor: "alice", Expires: time.Now().Add(time.Hour)}))
	}
	var mu sync.Mutex
	seen := map[string]string{}
	var wg sync.WaitGroup
	for _, w := range []struct {
		name string
		s    *Postgres
	}{{"a", a}, {"b", b}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				l, err := w.s.ClaimNotifications(ctx, w.name, []string{"hook"}, time.Minute, 4)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, r := range l {
					if prev, ok := seen[r.ID]; ok {
						t.Errorf("%s claimed by %s and %s", r.ID, prev, w.name)
					}
					seen[r.ID] = w.name
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(seen) != n {
		t.Fatalf("%d of %d rows claimed", len(seen), n)
	}
}

// TestReceiverMatches: each filter admits what it lists; a namespace filter excludes a notice
// without a namespace (a standalone gateway's), an empty one admits every namespace.
func TestReceiverMatches(t *testing.T) {
	n := Notice{Type: NoticeApprovalRequested, Tool: "payments.refund", Namespace: "payments", Risk: Risk{BlastRadius: "high"}}
	for _, c := range []struct {
		r    Receiver
		want bool
	}{
		{Receiver{}, true},
		{Receiver{Events: []string{NoticeApprovalRequested}, Tools: []string{"payments.*"}, Risk: []string{"high"}, Namespaces: []string{"payments"}}, true},
		{Receiver{Events: []string{NoticeAlertHalted}}, false},
		{Receiver{Tools: []string{"notes.*"}}, false},
		{Receiver{Risk: []string{"low"}}, false},
		{Receiver{Namespaces: []string{"ops", "payments"}}, true},
		{Receiver{Namespaces: []string{"ops"}}, false},
	} {
		if got := c.r.Matches(n); got != c.want {
			t.Errorf("%+v admits %v, want %v", c.r, got, c.want)
		}
	}
	if (&Receiver{Namespaces: []string{"payments"}}).Matches(Notice{Type: NoticeApprovalRequested}) {
		t.Error("a namespace filter admits a notice without a namespace")
	}
	// Alerts: a tools filter admits only an alert that names a matching tool (a rollback
	// step's); a risk filter only one whose risk it lists; an events filter of approval
	// events none.
	halted := Notice{Type: NoticeAlertHalted, Namespace: "payments"}
	step := Notice{Type: NoticeAlertRollbackFailed, Tool: "payments.refund", Risk: Risk{BlastRadius: "high"}}
	for _, c := range []struct {
		r    Receiver
		n    Notice
		want bool
	}{
		{Receiver{}, halted, true},
		{Receiver{Namespaces: []string{"payments"}}, halted, true},
		{Receiver{Events: []string{NoticeApprovalRequested, NoticeApprovalDenied}}, halted, false},
		{Receiver{Events: []string{NoticeAlertHalted}}, halted, true},
		{Receiver{Tools: []string{"*"}}, halted, false},
		{Receiver{Tools: []string{"payments.*"}}, halted, false},
		{Receiver{Risk: []string{"high"}}, halted, false},
		{Receiver{Tools: []string{"payments.*"}, Risk: []string{"high"}}, step, true},
		{Receiver{Tools: []string{"notes.*"}}, step, false},
		{Receiver{Risk: []string{"low"}}, step, false},
	} {
		if got := c.r.Matches(c.n); got != c.want {
			t.Errorf("%+v admits %s %v, want %v", c.r, c.n.Type, got, c.want)
		}
	}
}

// TestRetryNotifications: dead letters, by id or all of a receiver's, become pending again,
// due now, with attempts from zero; pending and delivered rows, and rows of receivers no
// longer configured, are left alone.
func TestRetryNotifications(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, clock *fakeClock) {
		ctx := context.Background()
		o := outboxOf(t, s)
		must[Run](t)(s.CreateRun(ctx, Run{ID: "r1", Actor: "alice"}))
		noErr(t, o.SetNotificationReceivers(ctx, []Receiver{{Name: "a"}, {Name: "b"}}))
		for range 3 {
			must[Approval](t)(s.CreateApproval(ctx, ApprovalRequest{Tool: "mem.delete", Run: "r1", Actor: "alice", Expires: clock.Now().Add(time.Hour)}))
		}
		rows := must[[]Notification](t)(o.ClaimNotifications(ctx, "w", []string{"a", "b"}, time.Minute, 10))
		if len(rows) != 6 {
			t.Fatalf("claimed %d rows, want 6", len(rows))
		}
		for i, r := range rows { // the first of each receiver stays pending, the others die
			state := NotificationDead
			if i < 2 {
				state = NotificationPending
			}
			noErr(t, o.FinishNotification(ctx, r.ID, "w", state, clock.Now().Add(time.Hour), "HTTP 502"))
		}
		dead := must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{State: NotificationDead}))
		if len(dead) != 4 {
			t.Fatalf("%d dead, want 4", len(dead))
		}
		if n := must[int](t)(o.RetryNotifications(ctx, []string{dead[0].ID, "ntf-none"}, "")); n != 1 {
			t.Fatalf("retry by id: %d, want 1", n)
		}
		again := must[[]Notification](t)(o.ClaimNotifications(ctx, "w", []string{"a", "b"}, time.Minute, 10))
		if len(again) != 1 || again[0].ID != dead[0].ID || again[0].Attempts != 0 || again[0].LastError != "HTTP 502" {
			t.Fatalf("claimed after the retry: %+v, want %s due now with attempts 0", again, dead[0].ID)
		}
		noErr(t, o.FinishNotification(ctx, again[0].ID, "w", NotificationDelivered, time.Time{}, ""))
		// Receiver b is no longer configured: its pending row dies, and its dead letters stay.
		noErr(t, o.SetNotificationReceivers(ctx, []Receiver{{Name: "a"}}))
		if n := must[int](t)(o.RetryNotifications(ctx, nil, "b")); n != 0 {
			t.Fatalf("retried %d rows of a receiver no longer configured", n)
		}
		left := 0
		for _, d := range must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{State: NotificationDead})) {
			if d.Sink == "a" {
				left++
			}
		}
		if n := must[int](t)(o.RetryNotifications(ctx, nil, "")); n != left || left == 0 {
			t.Fatalf("retry all: %d, want receiver a's %d dead letters", n, left)
		}
		if l := must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{State: NotificationDelivered})); len(l) != 1 {
			t.Fatalf("delivered rows %+v: a retry touched one", l)
		}
	})
}
