package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/reversi-gitops/reversi/internal/config"
	"github.com/reversi-gitops/reversi/internal/contracttest"
	"github.com/reversi-gitops/reversi/pkg/policy"
)

func init() { register(newTestCmd) }

func newTestCmd() *cobra.Command {
	var manifests, policies []string
	cmd := &cobra.Command{
		Use:   "test [FILES...] -m MANIFESTS [--policy POLICY]",
		Short: "Run manifest contract tests and the policy's own tests (no system is touched)",
		Long: "Reads contract test cases from FILES (files or folders; default: every *.yaml, *.yml and\n" +
			"*.json under tests/ next to reversi.config.yaml, or ./tests) and checks each against the\n" +
			"manifests (-m, default: manifests: in reversi.config.yaml, or ./manifests). With --policy\n" +
			"(default: policy: in reversi.config.yaml) it also runs the tests written in the policy\n" +
			"files against the whole policy set and the manifests. Prints `ok <name>` or\n" +
			"`FAIL <name>: <why>` per case (`ok policy <policy>: <name>` for policy tests), the tools\n" +
			"no case calls, the rules no policy test fires, and `N passed` (or `N passed, M failed`).\n" +
			"Exits 1 on any failure or invalid file.",
		RunE: func(cmd *cobra.Command, args []string) error {
			mpaths, err := config.ManifestPaths(manifests)
			if err != nil {
				return err
			}
			ppaths, err := config.PolicyPaths(policies)
			if err != nil {
				return err
			}
			files := args
			if len(files) == 0 {
				if files, err = defaultTestFiles(); err != nil {
					if len(ppaths) == 0 {
						return err
					}
					files = nil // only the policy's tests
				}
			}
			stdout := cmd.OutOrStdout()
			ms, errs := LoadManifests(mpaths...)
			var cases []contracttest.Case
			if len(files) > 0 {
				var cerrs []error
				cases, cerrs = contracttest.Read(files...)
				errs = append(errs, cerrs...)
			}
			var set *policy.Set
			if len(ppaths) > 0 {
				var perrs []error
				set, perrs = policy.Load(ppaths...)
				errs = append(errs, perrs...)
			}
			// Report every broken file at once; running against them would mislead.
			if len(errs) > 0 {
				return printInvalid(cmd, errs)
			}

			suite := contracttest.NewSuite(ms)
			failed, total := 0, len(cases)
			for _, r := range suite.RunAll(cases) {
				if r.Passed {
					fmt.Fprintf(stdout, "ok %s\n", r.Name)
				} else {
					failed++
					fmt.Fprintf(stdout, "FAIL %s: %s\n", r.Name, r.Why)
				}
			}
			var presults []policy.TestResult
			if set != nil {
				presults = set.RunTests(cmd.Context(), ms)
				total += len(presults)
				for _, r := range presults {
					if r.Passed {
						fmt.Fprintf(stdout, "ok policy %s: %s\n", r.Policy, r.Name)
					} else {
						failed++
						fmt.Fprintf(stdout, "FAIL policy %s: %s: %s\n", r.Policy, r.Name, r.Why)
					}
				}
			}
			if un := suite.Uncovered(cases); len(un) > 0 && len(cases) > 0 {
				fmt.Fprintf(stdout, "not covered by any test: %s\n", strings.Join(un, ", "))
			}
			if set != nil {
				if un := set.Uncovered(presults); len(un) > 0 {
					fmt.Fprintf(stdout, "not covered by any test: rule %s\n", strings.Join(un, ", rule "))
				}
			}
			passed := total - failed
			if failed > 0 {
				fmt.Fprintf(stdout, "%d passed, %d failed\n", passed, failed)
				return exitError{1}
			}
			fmt.Fprintf(stdout, "%d passed\n", passed)
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&manifests, "manifests", "m", nil, "manifest file or folder (repeatable; default: manifests: in "+config.FileName+", or ./manifests)")
	cmd.Flags().StringArrayVar(&policies, "policy", nil, "policy file or folder whose tests to run too (repeatable; default: policy: in "+config.FileName+")")
	return cmd
}

// defaultTestFiles is tests/ next to the project config, or ./tests without one.
func defaultTestFiles() ([]string, error) {
	c, err := config.Find()
	if err != nil {
		return nil, err
	}
	dir := "tests"
	if c.Dir != "" {
		dir = filepath.Join(c.Dir, "tests")
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, errors.New("no test files: pass files or folders, or put cases under " + dir)
	}
	return []string{dir}, nil
}
