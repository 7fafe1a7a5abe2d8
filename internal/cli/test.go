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
)

func init() { register(newTestCmd) }

func newTestCmd() *cobra.Command {
	var manifests []string
	cmd := &cobra.Command{
		Use:   "test [FILES...] -m MANIFESTS",
		Short: "Run manifest contract tests (no system is touched)",
		Long: "Reads contract test cases from FILES (files or folders; default: every *.yaml, *.yml and\n" +
			"*.json under tests/ next to reversi.config.yaml, or ./tests) and checks each against the\n" +
			"manifests (-m, default: manifests: in reversi.config.yaml, or ./manifests). Prints\n" +
			"`ok <name>` or `FAIL <name>: <why>` per case, the tools no case calls, and `N passed`\n" +
			"(or `N passed, M failed`). Exits 1 on any failure or invalid file.",
		RunE: func(cmd *cobra.Command, args []string) error {
			mpaths, err := config.ManifestPaths(manifests)
			if err != nil {
				return err
			}
			files := args
			if len(files) == 0 {
				if files, err = defaultTestFiles(); err != nil {
					return err
				}
			}
			stdout := cmd.OutOrStdout()
			ms, merrs := LoadManifests(mpaths...)
			cases, cerrs := contracttest.Read(files...)
			// Report every broken file at once; running against them would mislead.
			if errs := append(merrs, cerrs...); len(errs) > 0 {
				return printInvalid(cmd, errs)
			}

			suite := contracttest.NewSuite(ms)
			failed := 0
			for _, r := range suite.RunAll(cases) {
				if r.Passed {
					fmt.Fprintf(stdout, "ok %s\n", r.Name)
				} else {
					failed++
					fmt.Fprintf(stdout, "FAIL %s: %s\n", r.Name, r.Why)
				}
			}
			if un := suite.Uncovered(cases); len(un) > 0 {
				fmt.Fprintf(stdout, "not covered by any test: %s\n", strings.Join(un, ", "))
			}
			passed := len(cases) - failed
			if failed > 0 {
				fmt.Fprintf(stdout, "%d passed, %d failed\n", passed, failed)
				return exitError{1}
			}
			fmt.Fprintf(stdout, "%d passed\n", passed)
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&manifests, "manifests", "m", nil, "manifest file or folder (repeatable; default: manifests: in "+config.FileName+", or ./manifests)")
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
