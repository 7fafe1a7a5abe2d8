package cli

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	apipolicy "github.com/reversi-gitops/reversi/api/policy"
	"github.com/reversi-gitops/reversi/internal/config"
	"github.com/reversi-gitops/reversi/internal/lint"
)

func init() { register(newLintCmd) }

// lintReport is the --json output.
type lintReport struct {
	Findings []lint.Finding `json:"findings"`
	Errors   int            `json:"errors"`
	Warnings int            `json:"warnings"`
	Notes    int            `json:"notes"`
}

func newLintCmd() *cobra.Command {
	var strict, asJSON bool
	var policies []string
	var up upstreamFlags
	cmd := &cobra.Command{
		Use:   "lint [PATH...]",
		Short: "Find manifests that are valid but unsafe, incomplete or contradictory",
		Long: "Reads the manifests like validate (default: manifests: in reversi.config.yaml, or\n" +
			"./manifests) and prints one line per finding and a summary. Exits 1 on errors, and on\n" +
			"warnings with --strict. Invalid manifests are reported as by validate, and exit 1.\n" +
			"With --upstream-cmd, --upstream-url or --gateway-config it also checks the manifests\n" +
			"against the real tools' input schemas (L017, L020, L027, L033, L034, L035).\n" +
			"With --policy (default: policy: in reversi.config.yaml) it also lints the policy: CEL\n" +
			"syntax and type errors (L040, L041), rules that can never match (L042) and, with an\n" +
			"upstream, args.x the matched tools' input schemas lack (L043), each with file:line.",
		RunE: func(cmd *cobra.Command, args []string) error {
			// The lint rules assume a valid set (every named tool exists).
			ms, err := loadValid(cmd, args)
			if err != nil {
				return err
			}
			ppaths, err := config.PolicyPaths(policies)
			if err != nil {
				return err
			}
			var ps []*apipolicy.Policy
			if len(ppaths) > 0 {
				var perrs []error
				if ps, perrs = apipolicy.ReadPaths(ppaths...); len(perrs) > 0 {
					return printInvalid(cmd, perrs)
				}
			}
			findings := lint.Lint(ms)
			var tools []lint.UpstreamTool
			if up.given() {
				ts, err := up.tools(cmd)
				if err != nil {
					return err
				}
				tools = lintTools(ts)
				if tools == nil {
					tools = []lint.UpstreamTool{}
				}
				findings = lint.WithUpstream(ms, tools)
			}
			if ps != nil {
				findings = append(findings, lint.Policy(ps, ms, tools)...)
			}
			nErr, nWarn, nNote := lint.Counts(findings)
			out := cmd.OutOrStdout()
			if asJSON {
				if findings == nil {
					findings = []lint.Finding{}
				}
				enc := json.NewEncoder(out)
				enc.SetEscapeHTML(false) // keep "a -> b" readable
				enc.SetIndent("", "  ")
				if err := enc.Encode(lintReport{Findings: findings, Errors: nErr, Warnings: nWarn, Notes: nNote}); err != nil {
					return err
				}
			} else {
				for _, f := range findings {
					fmt.Fprintln(out, f)
				}
				fmt.Fprintln(out, lint.Summary(findings))
			}
			if nErr > 0 || (strict && nWarn > 0) {
				return exitError{1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&strict, "strict", false, "exit 1 on warnings too")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the findings and counts as JSON")
	cmd.Flags().StringArrayVar(&policies, "policy", nil, "policy file or folder to lint too (repeatable; default: policy: in "+config.FileName+")")
	up.register(cmd)
	return cmd
}
