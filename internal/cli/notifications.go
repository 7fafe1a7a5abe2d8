package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/notify"
	"github.com/reversi-gitops/reversi/gateway/store"
	projconfig "github.com/reversi-gitops/reversi/internal/config"
)

func init() { register(newNotificationsCmd) }

// newNotificationsCmd is `reversi notifications list`: the notification outbox of a gateway's
// store (issue 24): what was sent, what is waiting for a retry, and the dead letters.
func newNotificationsCmd() *cobra.Command {
	var sf storeFlags
	cmd := &cobra.Command{
		Use:   "notifications",
		Short: "List the gateway's notifications (the outbox of approval events and alerts); retry dead letters",
		Long: "The gateway announces every approval event (requested, approved, denied, expired,\n" +
			"escalated) and its alerts (reload refused, rollback failed, halted, resumed, upstream\n" +
			"down) to the receivers of notifications: in gateway.yaml or reversi.config.yaml and\n" +
			"$" + config.ApprovalWebhookEnv + " (approval events only). Each notification is written to the\n" +
			"store in the same transaction as its event, then delivered with retries; after the last\n" +
			"attempt it is dead (a dead letter) and stays listed here until it is retried.\n\n" +
			"  reversi notifications list --data .reversi\n" +
			"  reversi notifications list --state dead --data .reversi\n" +
			"  reversi notifications retry --all --data .reversi   (once the receiver is fixed)",
	}
	sf.add(cmd)
	var state string
	var asJSON bool
	list := &cobra.Command{
		Use:   "list [--state pending|delivered|dead]",
		Short: "List notifications, oldest first (every state by default)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var f store.NotificationFilter
			if state != "" && state != "all" {
				if !slices.Contains(store.NotificationStates, store.NotificationState(state)) {
					return fmt.Errorf("--state %q: use pending, delivered, dead or all", state)
				}
				f.State = store.NotificationState(state)
			}
			st, ob, err := openOutbox(&sf)
			if err != nil {
				return err
			}
			defer st.Close()
			l, err := ob.ListNotifications(cmd.Context(), f)
			if err != nil {
				return err
			}
			if asJSON {
				return writeNotificationsJSON(cmd.OutOrStdout(), l)
			}
			if len(l) == 0 {
				what := "notifications"
				if f.State != "" {
					what = state + " notifications"
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "No %s in %s.\n", what, storeWhere(st))
				return nil
			}
			return writeNotificationsTable(cmd.OutOrStdout(), l)
		},
	}
	list.Flags().StringVar(&state, "state", "all", "pending, delivered, dead or all")
	list.Flags().BoolVar(&asJSON, "json", false, "print the notifications as a JSON array")
	var all bool
	var receiver string
	retry := &cobra.Command{
		Use:   "retry ID... | --all [--receiver NAME]",
		Short: "Make dead letters pending again (attempts from zero), for the running gateway to deliver",
		Long: "Once a receiver is fixed, its dead letters can be delivered again: the running gateway\n" +
			"(any replica on the store) delivers them at once, with the same idempotency keys. Only\n" +
			"receivers configured now are retried.",
		RunE: func(cmd *cobra.Command, ids []string) error {
			if all == (len(ids) > 0) {
				return errors.New("name the dead letters (IDs from reversi notifications list --state dead) or give --all, not both")
			}
			if receiver != "" && !all {
				return errors.New("--receiver goes with --all")
			}
			st, ob, err := openOutbox(&sf)
			if err != nil {
				return err
			}
			defer st.Close()
			n, err := ob.RetryNotifications(cmd.Context(), ids, receiver)
			if err != nil {
				return err
			}
			if n < len(ids) {
				fmt.Fprintf(cmd.ErrOrStderr(), "%d of the %d named are not dead letters of a receiver configured now (see reversi notifications list).\n", len(ids)-n, len(ids))
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d dead letter(s) pending again in %s: the running gateway delivers them now.\n", n, storeWhere(st))
			return nil
		},
	}
	retry.Flags().BoolVar(&all, "all", false, "every dead letter (of --receiver, when given)")
	retry.Flags().StringVar(&receiver, "receiver", "", "with --all: only this receiver's")
	cmd.AddCommand(list, retry)
	return cmd
}

// openOutbox opens the store of sf and its notification outbox (the caller closes the store).
func openOutbox(sf *storeFlags) (store.Store, store.Outbox, error) {
	st, err := sf.open()
	if err != nil {
		return nil, nil, err
	}
	ob, ok := st.(store.Outbox)
	if !ok {
		_ = st.Close()
		return nil, nil, fmt.Errorf("%s has no notification outbox", storeWhere(st))
	}
	return st, ob, nil
}

// notificationJSON is one notification of `notifications list --json`.
type notificationJSON struct {
	ID          string       `json:"id"`
	Receiver    string       `json:"receiver"`
	State       string       `json:"state"`
	Attempts    int          `json:"attempts"`
	Created     time.Time    `json:"created"`
	NextAttempt *time.Time   `json:"next_attempt,omitempty"`
	Delivered   *time.Time   `json:"delivered,omitempty"`
	LastError   string       `json:"last_error,omitempty"`
	Notice      store.Notice `json:"notice"`
}

func writeNotificationsJSON(w io.Writer, l []store.Notification) error {
	out := make([]notificationJSON, 0, len(l))
	for _, n := range l {
		j := notificationJSON{ID: n.ID, Receiver: n.Sink, State: string(n.State), Attempts: n.Attempts, Created: n.Created,
			LastError: n.LastError, Notice: n.Notice}
		if !n.NextAttempt.IsZero() {
			j.NextAttempt = &n.NextAttempt
		}
		if !n.Delivered.IsZero() {
			j.Delivered = &n.Delivered
		}
		out = append(out, j)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func writeNotificationsTable(w io.Writer, l []store.Notification) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tEVENT\tAPPROVAL\tTOOL\tRECEIVER\tATTEMPTS\tCREATED\tLAST ERROR")
	for _, n := range l {
		last := n.LastError
		if len(last) > 80 {
			last = last[:77] + "..."
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", n.ID, n.State, n.Notice.Type, n.Notice.Approval, n.Notice.Tool,
			n.Sink, n.Attempts, n.Created.Format(time.RFC3339), strings.ReplaceAll(last, "\t", " "))
	}
	return tw.Flush()
}

// gatewayReceivers are the gateway's notification receivers: notifications: of gateway.yaml,
// then of reversi.config.yaml, then $REVERSI_APPROVAL_WEBHOOK.
func gatewayReceivers(g *config.Gateway, pc *projconfig.Config) ([]config.Notification, error) {
	rs := slices.Clone(g.Notifications)
	more, err := pc.Notifications(nil)
	if err != nil {
		return nil, err
	}
	rs = append(rs, more...)
	env, ok, err := config.ApprovalWebhook(nil)
	if err != nil {
		return nil, err
	}
	if ok {
		rs = append(rs, env)
	}
	return rs, nil
}

// gatewayNotifier builds the notification worker of a gateway on its store (the SQL store,
// before any Kubernetes wrapper): nil when no receiver is configured. The receivers' filters
// are installed on the store before the gateway serves a call, so no event is written without
// its notifications. storeFlags locate the store in the approve command of the messages.
func gatewayNotifier(ctx context.Context, st store.Store, g *config.Gateway, pc *projconfig.Config, name, storeFlags string, stderr io.Writer) (*notify.Worker, error) {
	rs, err := gatewayReceivers(g, pc)
	if err != nil || len(rs) == 0 {
		return nil, err
	}
	ob, ok := st.(store.Outbox)
	if !ok {
		return nil, errors.New("notifications: the store has no outbox")
	}
	return notify.New(ctx, notify.Options{Outbox: ob, Receivers: rs, Egress: pc.Egress, Gateway: name, StoreFlags: storeFlags,
		Logf: func(format string, args ...any) { fmt.Fprintf(stderr, "reversi-gateway: "+format+"\n", args...) }})
}
