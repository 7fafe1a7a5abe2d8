package cli

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

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
	var up upstreamFlags
	cmd := &cobra.Command{
		Use:   "lint [PATH...]",
		Short: "Find manifests that are valid but unsafe, incomplete or contradictory",
		Long: "Reads the manifests like validate (default: manifests: in reversi.config.yaml, or\n" +
			"./manifests) and prints one line per finding and a summary. Exits 1 on errors, and on\n" +
			"warnings with --strict. Invalid manifests are reported as by validate, and exit 1.\n" +
			"With --upstream-cmd, --upstream-url or --gateway-config it also checks the manifests\n" +
			"against the real tools' input schemas (L017, L020, L027, L033, L034, L035).",
		RunE: func(cmd *cobra.Command, args []string) error {
			// The lint rules assume a valid set (every named tool exists).
			ms, err := loadValid(cmd, args)
			if err != nil {
				return err
			}
			findings := lint.Lint(ms)
			if up.given() {
				tools, err := up.tools(cmd)
				if err != nil {
					return err
				}
				findings = lint.WithUpstream(ms, lintTools(tools))
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
	up.register(cmd)
	return cmd
}
