package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/proxy"
	"github.com/reversi-gitops/reversi/gateway/rollback"
	"github.com/reversi-gitops/reversi/gateway/store"
)

func init() { register(newRunRollbackCmd) }

// newRunRollbackCmd is `reversi rollback RUN [--confirm] [--approve-compensations] --config
// gateway.yaml [--data DIR] [--manifests ...]`: it connects to the upstreams of the gateway
// config (proxy.New, without serving), prints the plan and, confirmed, runs the compensations
// on those upstreams and prints each step's result and a summary. Exit 1 when a step failed,
// waits for approval or stays not undone. Source: seed "MCP gateway" (over stdio, "Operate it
// with the CLI against the same data store (`reversi approvals`, `reversi rollback`)";
// `reversi.execute_rollback`), issue 6.
func newRunRollbackCmd() *cobra.Command {
	var (
		sf                           storeFlags
		cfgFile, manifests, operator string
		confirm, approveComp, asJSON bool
		kubeconfig, namespace        string
	)
	cmd := &cobra.Command{
		Use:   "rollback RUN",
		Short: "Undo a run: plan, then (with --confirm) run each compensation on its upstream",
		Long: "Plans the rollback of RUN from the gateway's ledger (newest first: compensate, skip,\n" +
			"unrecoverable, not undone, with each compensation's kind and residue). With --confirm it\n" +
			"calls each compensation on the upstream that exposes it (3 attempts with backoff, the same\n" +
			"idempotency key in _meta[\"reversi/idempotency_key\"] every time), reads the result back\n" +
			"when the manifest declares a verification, and journals every step. Running it again\n" +
			"resumes: steps already undone are skipped, an unfinished compensation is retried with\n" +
			"the same key.\n\n" +
			"  reversi rollback run-7f3a --config gateway.yaml\n" +
			"  reversi rollback run-7f3a --config gateway.yaml --confirm\n" +
			"  reversi rollback run-7f3a --confirm --kubeconfig ~/.kube/config -n agents   # sets spec.rollback",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if kubeconfig != "" || namespace != "" {
				return kubeRollback(cmd.Context(), cmd.OutOrStdout(), args[0], kubeconfig, namespace, confirm, approveComp)
			}
			if cfgFile == "" {
				return errors.New("--config is required: the gateway config whose upstreams run the compensations")
			}
			file, errs := config.Load(cfgFile)
			if len(errs) > 0 {
				return errors.Join(errs...)
			}
			g, err := config.Merge(file, config.Flags{})
			if err != nil {
				return err
			}
			src, _, err := manifestSource(manifests)
			if err != nil {
				return err
			}
			var ms []*manifest.Manifest
			if src != "" {
				l, _, err := loadGatewayManifests(src)
				if err != nil {
					return err
				}
				ms = l.Manifests
			}
			st, err := sf.open()
			if err != nil {
				return err
			}
			defer st.Close()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			run := args[0]
			if _, err := st.GetRun(ctx, run); err != nil {
				if errors.Is(err, store.ErrNotFound) {
					return fmt.Errorf("no run %s in the store at %s: list runs with reversi.list_runs, or pass the gateway's --data", run, sf.data)
				}
				return err
			}
			gw, err := proxy.New(ctx, proxy.Options{Config: g, Manifests: ms, Store: st, Stderr: io.Discard})
			if err != nil {
				return err
			}
			defer gw.Close()
			res, err := gw.ExecuteRollback(ctx, run, rollback.Options{Confirm: confirm, ApproveCompensations: approveComp, Operator: operator})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(res); err != nil {
					return err
				}
			} else {
				writeRollback(out, res)
			}
			if !res.OK {
				return exitError{1}
			}
			return nil
		},
	}
	sf.add(cmd)
	f := cmd.Flags()
	f.StringVar(&cfgFile, "config", "", "gateway.yaml whose upstreams expose the compensation tools (required)")
	f.StringVar(&manifests, "manifests", "", "manifest file, folder or registry (default: as for reversi gateway)")
	f.BoolVar(&confirm, "confirm", false, "execute the compensations (without it: a dry run that changes nothing)")
	f.BoolVar(&approveComp, "approve-compensations", false, "run compensations that require approval without waiting for the approval queue")
	f.StringVar(&operator, "operator", defaultOperator(), "who runs the rollback, noted in the ledger")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	f.StringVar(&kubeconfig, "kubeconfig", "", "Kubernetes mode: set spec.rollback of the ReversiRun RUN (reached with this kubeconfig); a gateway replica executes it")
	f.StringVarP(&namespace, "namespace", "n", "", "Kubernetes mode: namespace of the ReversiRun (default: the kubeconfig's)")
	return cmd
}

func defaultOperator() string {
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return "operator"
}

// writeRollback prints the plan and, when confirmed, each step's result and the summary.
func writeRollback(out io.Writer, res rollback.Result) {
	fmt.Fprintf(out, "Rollback plan of run %s (newest first):\n", res.Run)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tTOOL\tACTION\tCOMPENSATION\tKIND\tRESIDUE\tREASON")
	for _, s := range res.Plan.Steps {
		comp, kind, residue := "-", "-", "-"
		if c := s.Compensation; c != nil {
			comp = c.Tool
			if c.Kind != "" {
				kind = c.Kind
			}
			if len(c.Residue) > 0 {
				residue = strings.Join(c.Residue, "; ")
			} else if c.Kind == manifest.KindInverse {
				residue = "none"
			}
		}
		reason := s.Reason
		if s.Check != nil && s.Check.Problem != "" {
			reason += " [" + s.Check.Problem + "]"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Step, s.Tool, s.Action, comp, kind, residue, oneLine(reason))
	}
	tw.Flush()
	if !res.Confirmed {
		fmt.Fprintf(out, "dry run: nothing was executed; %d compensation(s) would run. Pass --confirm to execute.\n", res.Plan.Summary.Compensate)
		return
	}
	fmt.Fprintln(out, "\nResults:")
	for _, s := range res.Steps {
		line := fmt.Sprintf("step %d %s: %s", s.Step, s.Tool, s.Status)
		var parts []string
		if s.Compensation != nil && s.Action == manifest.PlanCompensate {
			parts = append(parts, s.Compensation.Tool)
		}
		if s.Attempts > 0 {
			parts = append(parts, fmt.Sprintf("%d attempt(s)", s.Attempts))
		}
		if s.IdempotencyKey != "" {
			parts = append(parts, "key "+s.IdempotencyKey)
		}
		if s.Earlier {
			parts = append(parts, "by an earlier rollback")
		}
		if v := s.Verification; v != nil {
			switch {
			case v.Mismatch != "":
				parts = append(parts, "read-back "+v.Tool+" mismatch: "+v.Mismatch)
			case v.Error != "":
				parts = append(parts, "read-back "+v.Tool+": "+v.Error)
			default:
				parts = append(parts, fmt.Sprintf("read-back %s matched (%d attempt(s))", v.Tool, v.Attempts))
			}
		}
		if s.Error != "" && (s.Verification == nil || s.Verification.Mismatch == "") {
			parts = append(parts, s.Error)
		} else if !s.Undone() && s.Error == "" && s.Reason != "" {
			parts = append(parts, s.Reason)
		}
		if len(parts) > 0 {
			line += " (" + oneLine(strings.Join(parts, "; ")) + ")"
		}
		fmt.Fprintln(out, line)
	}
	sum := res.Summary
	fmt.Fprintf(out, "\nundone: %d step(s)", len(sum.Undone))
	for _, u := range sum.Undone {
		fmt.Fprintf(out, "\n  step %d %s (%s)", u.Step, u.Tool, u.Status)
	}
	fmt.Fprintf(out, "\nresidue: ")
	if len(sum.Residue) == 0 {
		fmt.Fprint(out, "none declared")
	}
	for _, r := range sum.Residue {
		fmt.Fprintf(out, "\n  %s", r)
	}
	fmt.Fprintf(out, "\nnot undone: %d step(s)", len(sum.NotUndone))
	for _, n := range sum.NotUndone {
		fmt.Fprintf(out, "\n  step %d %s: %s: %s", n.Step, n.Tool, n.Status, oneLine(n.Reason))
	}
	fmt.Fprintf(out, "\n%d skipped (nothing to undo)\n%s\n", sum.Skipped, res.Phase)
}
