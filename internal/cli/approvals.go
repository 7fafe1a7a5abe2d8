package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/approvalrules"
)

func init() { register(newApprovalsCmd) }

// approvalStates are the values of `approvals list --state`.
var approvalStates = []string{"pending", "approved", "denied", "expired", "all"}

// storeFlags locate the gateway's store: the same --data and --store as `reversi gateway`.
type storeFlags struct{ data, kind, dbURL string }

func (s *storeFlags) add(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&s.data, "data", DefaultDataDir, "data folder of the gateway's sqlite store (the gateway's --data)")
	cmd.PersistentFlags().StringVar(&s.kind, "store", "sqlite", "store kind: sqlite or postgres (memory cannot be shared with a running gateway)")
	cmd.PersistentFlags().StringVar(&s.dbURL, "database-url", "", "URL of the gateway's postgres store (the gateway's --database-url; default $"+DatabaseURLEnv+")")
}

// open opens the existing store of a gateway. It never creates one: a wrong --data would
// otherwise show an empty queue (list) or report every id as unknown, which says nothing
// about the real gateway.
func (s *storeFlags) open() (store.Store, error) {
	switch s.kind {
	case "sqlite":
	case "postgres":
		return openExistingPostgres(context.Background(), s.dbURL)
	case "memory":
		return nil, errors.New("--store memory: a memory store lives only inside its gateway process; " +
			"run the gateway with --store sqlite (the default) to decide its approvals from the CLI")
	default:
		return nil, fmt.Errorf("--store %q: use sqlite or postgres", s.kind)
	}
	db := filepath.Join(s.data, store.SQLiteFile)
	if _, err := os.Stat(db); err != nil {
		return nil, fmt.Errorf("no gateway store at %s (%v): pass --data with the folder the gateway was started with (its --data, default %s)",
			db, errors.Unwrap(err), DefaultDataDir)
	}
	return store.OpenSQLite(s.data, nil)
}

// newApprovalsCmd is `reversi approvals list|approve|deny`: the approval queue of a standalone
// gateway, read and decided in the gateway's own store (store.OpenSQLite under --data) while it
// runs. Decisions go through store.Decide, which holds the rules. Source: issue 5 (Standalone
// approvals), seed "MCP gateway" (over stdio, "operate it with the CLI against the same data
// store (`reversi approvals`, ...)").
func newApprovalsCmd() *cobra.Command {
	var sf storeFlags
	cmd := &cobra.Command{
		Use:   "approvals",
		Short: "List, approve and deny the approval requests of a standalone gateway (same --data store)",
		Long: "A call whose manifest requires approval is blocked with the id of an approval request\n" +
			"(\"Blocked by Reversi: <tool> requires approval: request apr-... is waiting for an approver\").\n" +
			"These commands read and decide those requests in the gateway's store, also while the\n" +
			"gateway runs; the agent's retry of the same call (same run, tool and arguments) passes\n" +
			"once the request is approved. The manifest's approval rules apply: roles, quorum of\n" +
			"distinct principals, timeout and on_timeout; the run's own actor cannot approve.\n\n" +
			"Standalone mode trusts --by and --role as given: whoever can write the data folder can\n" +
			"decide. Protect the folder, or run the gateway in Kubernetes, where approvers are the\n" +
			"API server's users.\n\n" +
			"  reversi approvals list --data .reversi\n" +
			"  reversi approvals show apr-7f3a... --data .reversi      # the request and its decision records\n" +
			"  reversi approvals approve apr-7f3a... --by bob --role finance --reason FIN-12\n" +
			"  reversi approvals deny apr-7f3a... --by bob --role finance --reason \"wrong customer\"",
	}
	sf.add(cmd)
	cmd.AddCommand(newApprovalsListCmd(&sf), newApprovalsShowCmd(&sf), newDecideCmd(&sf, true), newDecideCmd(&sf, false))
	return cmd
}

func newApprovalsListCmd(sf *storeFlags) *cobra.Command {
	var state string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List approval requests (pending by default)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !slices.Contains(approvalStates, state) {
				return fmt.Errorf("--state %q: use one of %s", state, strings.Join(approvalStates, ", "))
			}
			st, err := sf.open()
			if err != nil {
				return err
			}
			defer st.Close()
			f := store.ApprovalFilter{}
			if state != "all" {
				f.State = store.ApprovalState(state)
			}
			list, err := st.ListApprovals(cmd.Context(), f)
			if err != nil {
				return err
			}
			if asJSON {
				return writeApprovalsJSON(cmd.OutOrStdout(), list)
			}
			if len(list) == 0 {
				what := state + " approval requests"
				if state == "all" {
					what = "approval requests"
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "No %s in %s.\n", what, storeWhere(st))
				return nil
			}
			return writeApprovalsTable(cmd.OutOrStdout(), list, time.Now())
		},
	}
	cmd.Flags().StringVar(&state, "state", "pending", "pending, approved, denied, expired or all")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the requests as a JSON array")
	return cmd
}

// approvingCount is the number of distinct principals that approved a (store.Approval keeps
// at most one decision per principal).
func approvingCount(a store.Approval) int {
	n := 0
	for _, d := range a.Decisions {
		if d.Approve {
			n++
		}
	}
	return n
}

// writeApprovalsTable prints list as kubectl get does: a header and aligned columns. EXPIRES
// is relative to now ("in 59m", or "3m ago" once passed).
func writeApprovalsTable(out io.Writer, list []store.Approval, now time.Time) error {
	tw := tabwriter.NewWriter(out, 6, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "ID\tTOOL\tRUN\tACTOR\tSTATE\tAPPROVALS\tROLES\tEXPIRES\tREASON")
	for _, a := range list {
		roles := "<any>"
		if len(a.Roles) > 0 {
			roles = strings.Join(a.Roles, ",")
		}
		expires := "in " + duration.HumanDuration(a.Expires.Sub(now))
		if !a.Expires.After(now) {
			expires = duration.HumanDuration(now.Sub(a.Expires)) + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", a.ID, a.Tool, a.Run, a.Actor, a.State,
			approvingCount(a), a.Quorum, roles, expires, oneLine(a.Reason))
	}
	return tw.Flush()
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// approvalJSON is the --json form of one request. Field names follow the ApprovalRequest
// custom resource (DESIGN.md "Custom resources"), so scripts can move to Kubernetes unchanged.
type approvalJSON struct {
	ID              string         `json:"id"`
	Tool            string         `json:"tool"`
	ArgumentsDigest string         `json:"argumentsDigest"`
	Run             string         `json:"run"`
	Actor           string         `json:"actor"`
	Reason          string         `json:"reason"`
	Roles           []string       `json:"roles"`
	Quorum          int            `json:"quorum"`
	CreatedAt       time.Time      `json:"createdAt"`
	ExpiresAt       time.Time      `json:"expiresAt"`
	OnTimeout       string         `json:"onTimeout"`
	EscalateTo      []string       `json:"escalateTo"`
	Escalated       bool           `json:"escalated"`
	State           string         `json:"state"`
	Approvals       int            `json:"approvals"`
	Decisions       []decisionJSON `json:"decisions"`
	DecidedAt       *time.Time     `json:"decidedAt,omitempty"`
	ConsumedAt      *time.Time     `json:"consumedAt,omitempty"`
}

type decisionJSON struct {
	By       string    `json:"by"`
	Roles    []string  `json:"roles"`
	Decision string    `json:"decision"` // Approve or Deny, as in the Approval resource
	Reason   string    `json:"reason,omitempty"`
	At       time.Time `json:"at"`
}

func toApprovalJSON(a store.Approval) approvalJSON {
	opt := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		return &t
	}
	nonNil := func(s []string) []string {
		if s == nil {
			return []string{}
		}
		return s
	}
	onTimeout := a.OnTimeout
	if onTimeout == "" {
		onTimeout = "deny"
	}
	j := approvalJSON{ID: a.ID, Tool: a.Tool, ArgumentsDigest: a.ArgsDigest, Run: a.Run, Actor: a.Actor,
		Reason: a.Reason, Roles: nonNil(a.Roles), Quorum: a.Quorum, CreatedAt: a.Created, ExpiresAt: a.Expires,
		OnTimeout: onTimeout, EscalateTo: nonNil(a.EscalateTo), Escalated: a.Escalated, State: string(a.State),
		Approvals: approvingCount(a), Decisions: []decisionJSON{}, DecidedAt: opt(a.Decided), ConsumedAt: opt(a.Consumed)}
	for _, d := range a.Decisions {
		verdict := "Deny"
		if d.Approve {
			verdict = "Approve"
		}
		j.Decisions = append(j.Decisions, decisionJSON{By: d.By, Roles: nonNil(d.Roles), Decision: verdict, Reason: d.Comment, At: d.At})
	}
	return j
}

func writeApprovalsJSON(out io.Writer, list []store.Approval) error {
	js := make([]approvalJSON, 0, len(list))
	for _, a := range list {
		js = append(js, toApprovalJSON(a))
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(js)
}

// decisionRecordJSON is one decision record of `approvals show --json` (store.KindApproval).
type decisionRecordJSON struct {
	Seq      int64     `json:"seq"`
	Time     time.Time `json:"time"`
	Event    string    `json:"event"`
	Step     int64     `json:"step,omitempty"`
	Approver string    `json:"approver,omitempty"`
	Groups   []string  `json:"groups,omitempty"`
	Decision string    `json:"decision,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	Note     string    `json:"note,omitempty"`
}

// showJSON is `approvals show --json`: the request and its decision records.
type showJSON struct {
	Request approvalJSON         `json:"request"`
	Records []decisionRecordJSON `json:"records"`
}

// decisionRecords returns the decision records of request a in its run, in ledger order.
func decisionRecords(ctx context.Context, st store.Store, a store.Approval) ([]store.Record, error) {
	var out []store.Record
	for after := int64(0); ; {
		recs, err := st.Records(ctx, a.Run, after, 1000)
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			if r.Kind == store.KindApproval && r.Approval == a.ID {
				out = append(out, r)
			}
			after = r.Seq
		}
		if len(recs) < 1000 {
			return out, nil
		}
	}
}

// newApprovalsShowCmd is `reversi approvals show ID`: one request and the decision records of
// its run that concern it (requested, counted, rejected, the phase reached, consumed,
// replay_refused, ignored), from the gateway's store. Source: issue 16 ("`reversi approvals`
// ... show the decisions as ledger records").
func newApprovalsShowCmd(sf *storeFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID [--json]",
		Short: "Show one approval request and its decision records (who decided what, with which groups, and its use)",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("show takes one approval request id (apr-...), got %d arguments: see `reversi approvals list --state all`", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := sf.open()
			if err != nil {
				return err
			}
			defer st.Close()
			id := args[0]
			a, err := st.GetApproval(cmd.Context(), id)
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("no approval request %s in %s: check the id and --data with `reversi approvals list --state all`", id, storeWhere(st))
			}
			if err != nil {
				return err
			}
			recs, err := decisionRecords(cmd.Context(), st, a)
			if err != nil {
				return err
			}
			if asJSON {
				j := showJSON{Request: toApprovalJSON(a), Records: []decisionRecordJSON{}}
				for _, r := range recs {
					j.Records = append(j.Records, decisionRecordJSON{Seq: r.Seq, Time: r.Time, Event: string(r.Event), Step: r.Step,
						Approver: r.Approver, Groups: r.Groups, Decision: r.Decision, Reason: r.Reason, Note: r.Note})
				}
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(j)
			}
			return writeShow(cmd.OutOrStdout(), a, recs)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the request and its records as JSON")
	return cmd
}

// writeShow prints a request and its decision records as text.
func writeShow(out io.Writer, a store.Approval, recs []store.Record) error {
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return oneLine(s)
	}
	actor := a.Actor
	if a.ActorUID != "" || a.ActorEmail != "" {
		actor += fmt.Sprintf(" (uid %s, e-mail %s)", dash(a.ActorUID), dash(a.ActorEmail))
	}
	fmt.Fprintf(out, "Request:   %s\nTool:      %s\nArguments: %s\nRun:       %s\nActor:     %s\nState:     %s (%d/%d approvals)\nRoles:     %s\nReason:    %s\n",
		a.ID, a.Tool, a.ArgsDigest, a.Run, actor, a.State, approvingCount(a), a.Quorum, dash(strings.Join(a.Roles, ", ")), dash(a.Reason))
	if !a.Expires.IsZero() {
		fmt.Fprintf(out, "Expires:   %s\n", a.Expires.Format(time.RFC3339))
	}
	if !a.Consumed.IsZero() {
		fmt.Fprintf(out, "Consumed:  %s\n", a.Consumed.Format(time.RFC3339))
	}
	if a.Kept() {
		fmt.Fprintf(out, "Object:    ApprovalRequest uid %s, spec %s\n", a.UID, a.SpecDigest)
	}
	if len(recs) == 0 {
		fmt.Fprintln(out, "\nNo decision records.")
		return nil
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tEVENT\tAPPROVER\tGROUPS\tDECISION\tREASON\tNOTE")
	for _, r := range recs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Seq, r.Time.Format(time.RFC3339), r.Event, dash(r.Approver),
			dash(strings.Join(r.Groups, ",")), dash(r.Decision), dash(r.Reason), dash(r.Note))
	}
	return tw.Flush()
}

func newDecideCmd(sf *storeFlags, approve bool) *cobra.Command {
	var by, reason, uid, email string
	var roles []string
	verb, short := "deny", "Deny a pending request: one deny denies, and the agent's retry stays blocked"
	if approve {
		verb, short = "approve", "Approve a pending request; the agent's retry passes once the quorum is reached"
	}
	cmd := &cobra.Command{
		Use:   verb + " ID --by NAME [--role ROLE ...] [--reason TEXT]",
		Short: short,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("%s takes one approval request id (apr-...), got %d arguments: see `reversi approvals list`", verb, len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			// Fail closed: a decision is never made in the name of a default principal.
			by = strings.TrimSpace(by)
			if by == "" {
				return fmt.Errorf("--by is required: name the principal who decides (there is no default, so no decision is recorded in someone else's name)")
			}
			st, err := sf.open()
			if err != nil {
				return err
			}
			defer st.Close()
			id := args[0]
			a, err := st.Decide(cmd.Context(), id, store.Decision{By: by, UID: uid, Email: email, Roles: roles, Approve: approve, Comment: reason})
			if err != nil {
				return decideError(cmd.Context(), st, verb, id, by, roles, err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), decisionLine(a, by))
			return nil
		},
	}
	cmd.Flags().StringVar(&by, "by", "", "the principal deciding (required)")
	cmd.Flags().StringSliceVar(&roles, "role", nil, "a role or group the principal holds (repeatable); the request names the roles it accepts")
	cmd.Flags().StringVar(&reason, "reason", "", "why, kept with the decision (e.g. a ticket)")
	cmd.Flags().StringVar(&uid, "uid", "", "the principal's uid, compared with the run's actor's (an approver with the actor's uid is the actor) and with the other approvers' (one person, one vote)")
	cmd.Flags().StringVar(&email, "email", "", "the principal's e-mail, compared as --uid is")
	return cmd
}

// decisionLine is the one line printed after a decision: the request's new state.
func decisionLine(a store.Approval, by string) string {
	switch a.State {
	case store.ApprovalApproved:
		return fmt.Sprintf("%s approved (%d/%d)", a.ID, approvingCount(a), a.Quorum)
	case store.ApprovalDenied:
		return fmt.Sprintf("%s denied by %s", a.ID, by)
	default:
		return fmt.Sprintf("%s %s (%d/%d approvals)", a.ID, a.State, approvingCount(a), a.Quorum)
	}
}

// decideError turns a store error of Decide into a message that says what to do.
func decideError(ctx context.Context, st store.Store, verb, id, by string, roles []string, err error) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("no approval request %s in this store: check the id and --data with `reversi approvals list --state all`", id)
	case errors.Is(err, store.ErrNotPending):
		a, gerr := st.GetApproval(ctx, id)
		if gerr != nil {
			return fmt.Errorf("cannot %s %s: it is no longer pending", verb, id)
		}
		msg := fmt.Sprintf("cannot %s %s: it is already %s", verb, id, a.State)
		if !a.Decided.IsZero() {
			msg += " (since " + a.Decided.Format(time.RFC3339) + ")"
		}
		return errors.New(msg + "; only a pending request can be decided, and a new call by the agent queues a new request")
	case errors.Is(err, store.ErrNotAllowed):
		a, gerr := st.GetApproval(ctx, id)
		switch {
		case gerr != nil:
		case a.Kept(), errors.Is(err, approvalrules.ErrActorAlias):
			return fmt.Errorf("cannot %s %s: %s", verb, id, strings.TrimPrefix(err.Error(), store.ErrNotAllowed.Error()+": "))
		case verb == "approve" && by == a.Actor:
			return fmt.Errorf("cannot approve %s: %s opened run %s and may not approve its own call; another principal must approve", id, by, a.Run)
		case slices.ContainsFunc(a.Decisions, func(d store.Decision) bool { return d.By == by }):
			return fmt.Errorf("cannot %s %s: %s has already decided it; the quorum (%d) counts distinct principals, so another approver must decide", verb, id, by, a.Quorum)
		case len(a.Roles) > 0:
			held := "no --role"
			if len(roles) > 0 {
				held = "--role " + strings.Join(roles, ",")
			}
			return fmt.Errorf("cannot %s %s: it needs an approver holding one of the roles %s, and %s was given for %s; pass --role with one of them if %s holds it",
				verb, id, strings.Join(a.Roles, ", "), held, by, by)
		}
		return fmt.Errorf("cannot %s %s: %w", verb, id, err)
	case errors.Is(err, store.ErrInvalid):
		return fmt.Errorf("cannot %s %s: %w", verb, id, err)
	}
	return fmt.Errorf("%s %s: %w", verb, id, err)
}
