package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/internal/config"
)

func init() { register(newValidateCmd) }

func newValidateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "validate [PATH...]",
		Short: "Validate tool manifest files and folders (every error at once)",
		Long: "Reads every *.json, *.yaml and *.yml file under each PATH (default: manifests: in\n" +
			"reversi.config.yaml, or ./manifests) and checks each manifest and the set as a whole.\n" +
			"Prints `ok: N tool manifests valid`, or every error and exits 1.",
		RunE: func(cmd *cobra.Command, args []string) error {
			paths, err := config.ManifestPaths(args)
			if err != nil {
				return err
			}
			ms, errs := LoadManifests(paths...)
			if len(errs) > 0 {
				for _, e := range errs {
					fmt.Fprintln(cmd.ErrOrStderr(), e)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "invalid: %d %s\n", len(errs), plural(len(errs), "error", "errors"))
				return exitError{1}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "ok: %d tool manifests valid\n", len(ms))
			return nil
		},
	}
}

// LoadManifests reads and validates the manifests under paths: every syntax, field and
// cross-manifest error together, ordered by file and line.
func LoadManifests(paths ...string) ([]*manifest.Manifest, []error) {
	docs, errs := manifest.ReadPaths(paths...)
	ms, verrs := manifest.ValidateDocuments(docs)
	errs = append(errs, verrs...)
	manifest.SortErrors(errs)
	return ms, errs
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
