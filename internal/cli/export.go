package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/reversi-gitops/reversi/internal/config"
	"github.com/reversi-gitops/reversi/pkg/export"
)

func newExportCmd() *cobra.Command {
	var reg, format, namespace string
	cmd := &cobra.Command{
		Use:   "export --format crd",
		Short: "Write the registry's loaded versions as signed ToolManifest objects (YAML) for Argo CD, Flux or kubectl",
		Long: "Prints one ToolManifest per tool (the newest non-draft version, checksums and, with the\n" +
			"project's trusted keys, signatures checked) with its signature in the reversi.dev/signature\n" +
			"and reversi.dev/key-id annotations, as a multi-document YAML stream.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != "crd" {
				return fmt.Errorf("--format %q: only crd is supported", format)
			}
			r, err := registryFlag(reg)
			if err != nil {
				return err
			}
			trust, err := projectTrust()
			if err != nil {
				return err
			}
			snap, errs := r.Load(trust)
			if len(errs) > 0 {
				return printInvalid(cmd, errs)
			}
			for _, m := range snap.Manifests {
				tm, err := export.ToolManifest(namespace, m.Tool, snap.Entries[m.Tool], snap.Canonical[m.Tool])
				if err != nil {
					return err
				}
				if err := export.WriteYAML(cmd.OutOrStdout(), tm); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&reg, "registry", "", "registry folder (default: manifests: in "+config.FileName+")")
	cmd.Flags().StringVar(&format, "format", "crd", "output format: crd (ToolManifest objects)")
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "namespace of the objects (default: none, so kubectl -n or Kustomize sets it)")
	return cmd
}
