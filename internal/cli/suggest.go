package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/suggest"
	"github.com/reversi-gitops/reversi/internal/config"
)

func init() { register(newSuggestCmd) }

func newSuggestCmd() *cobra.Command {
	var (
		up        upstreamFlags
		manifests []string
		out       string
	)
	cmd := &cobra.Command{
		Use:   "suggest-manifest (--upstream-cmd CMD [--upstream-arg A]... | --upstream-url URL | --gateway-config gateway.yaml) -o DIR",
		Short: "Draft a manifest for every tool of an MCP server that has none",
		Long: "Connects to the MCP server(s) and writes DIR/<tool>.yaml for every tool without a\n" +
			"manifest, from its name, description, input schema, annotations and the mcp-compensate\n" +
			"convention. Each draft has status: draft, a confidence (low, medium or high), comments\n" +
			"saying what was guessed, a schema_hash and a TODO residue where the undo needs\n" +
			"describing. Prints `DIR/<tool>.yaml <confidence>` per draft and a summary. Tools that\n" +
			"have a manifest under -m (default: manifests: in reversi.config.yaml, or ./manifests\n" +
			"when present) are skipped. An existing file in DIR is never overwritten.\n\n" +
			"  reversi suggest-manifest --upstream-cmd node --upstream-arg server.js -o drafts",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !up.given() {
				return errors.New("no upstream: give --upstream-cmd (with --upstream-arg), --upstream-url or --gateway-config")
			}
			if out == "" {
				return errors.New("-o DIR is required: the folder to write the drafts to")
			}
			ms, err := suggestManifests(cmd, manifests)
			if err != nil {
				return err
			}
			tools, err := up.tools(cmd)
			if err != nil {
				return err
			}
			res := suggest.Suggest(tools, ms)
			for _, d := range res.Drafts {
				p := filepath.Join(out, d.File)
				if _, err := os.Lstat(p); err == nil {
					return fmt.Errorf("%s exists: remove it, or pass its folder with -m so its tools are skipped", p)
				}
			}
			if len(res.Drafts) > 0 {
				if err := os.MkdirAll(out, 0o755); err != nil {
					return err
				}
			}
			w := cmd.OutOrStdout()
			for _, d := range res.Drafts {
				p := filepath.Join(out, d.File)
				if err := os.WriteFile(p, d.YAML, 0o644); err != nil {
					return err
				}
				fmt.Fprintf(w, "%s %s\n", p, d.Confidence)
			}
			for _, r := range res.Refused {
				fmt.Fprintf(cmd.ErrOrStderr(), "not drafted: %s: %s\n", r.Tool, r.Reason)
			}
			fmt.Fprintf(w, "%d drafted, %d skipped (already have manifests)\n", len(res.Drafts), len(res.Skipped))
			if len(res.Refused) > 0 {
				return exitError{1}
			}
			return nil
		},
	}
	up.register(cmd)
	cmd.Flags().StringArrayVarP(&manifests, "manifests", "m", nil, "manifest file, folder or registry whose tools are skipped (repeatable)")
	cmd.Flags().StringVarP(&out, "out", "o", "", "folder to write the drafts to (created if missing)")
	return cmd
}

// suggestManifests loads the manifests whose tools are skipped: the -m paths, else the
// project's (manifests: in reversi.config.yaml, or ./manifests), else none. Invalid manifests
// are printed and stop the command, as in validate.
func suggestManifests(cmd *cobra.Command, paths []string) ([]*manifest.Manifest, error) {
	if len(paths) == 0 {
		c, err := config.Find()
		if err != nil {
			return nil, err
		}
		if c.Manifests == "" {
			if fi, err := os.Stat("manifests"); err != nil || !fi.IsDir() {
				return nil, nil
			}
		}
		if paths, err = config.ManifestPaths(nil); err != nil {
			return nil, err
		}
	}
	ms, errs := LoadManifests(paths...)
	if len(errs) > 0 {
		return nil, printInvalid(cmd, errs)
	}
	return ms, nil
}
