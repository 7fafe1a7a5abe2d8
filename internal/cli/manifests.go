package cli

import (
	"errors"
	"fmt"
	"os/user"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/internal/config"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

func init() { register(newManifestsCmd) }

// writerFlags are the flags of every command that writes a version.
type writerFlags struct {
	registry, by, key, note string
}

func (w *writerFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&w.registry, "registry", "", "registry folder (default: manifests: in "+config.FileName+")")
	cmd.Flags().StringVar(&w.by, "by", "", "who is writing (default: the current user)")
	cmd.Flags().StringVar(&w.key, "key", "", "Ed25519 private key (PEM) to sign the version with")
	cmd.Flags().StringVar(&w.note, "note", "", "a note kept with the version")
}

// open resolves the registry and the write options, printing a key-permission warning.
func (w *writerFlags) open(cmd *cobra.Command) (*registry.Registry, registry.WriteOptions, error) {
	reg, err := registryFlag(w.registry)
	if err != nil {
		return nil, registry.WriteOptions{}, err
	}
	o := registry.WriteOptions{By: w.by, Note: w.note}
	if o.By == "" {
		if u, err := user.Current(); err == nil {
			o.By = u.Username
		}
	}
	if o.By == "" {
		return nil, o, errors.New("--by is required: who is writing this version")
	}
	if w.key != "" {
		s, warning, err := signing.LoadSigner(w.key)
		if err != nil {
			return nil, o, err
		}
		if warning != "" {
			fmt.Fprintln(cmd.ErrOrStderr(), warning)
		}
		o.Signer = s
	}
	return reg, o, nil
}

// registryFlag is --registry, or manifests: from the project config.
func registryFlag(flag string) (*registry.Registry, error) {
	if flag != "" {
		return registry.New(flag), nil
	}
	c, err := config.Find()
	if err != nil {
		return nil, err
	}
	if c.Manifests == "" {
		return nil, errors.New("no registry: pass --registry DIR or set manifests: in " + config.FileName)
	}
	return registry.New(c.Resolve(c.Manifests)), nil
}

func newManifestsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "manifests",
		Short: "Publish, approve, inspect and verify versions in a signed manifest registry",
	}
	cmd.AddCommand(newPublishCmd(), newApproveCmd(), newDeprecateCmd(), newRollbackCmd(),
		newHistoryCmd(), newDiffCmd(), newListCmd(), newVerifyCmd(), newCheckCmd(), newExportCmd(), newSignCmd())
	return cmd
}

func newPublishCmd() *cobra.Command {
	var w writerFlags
	var status string
	cmd := &cobra.Command{
		Use:   "publish PATH...",
		Short: "Add manifest files or folders as new versions (--status draft, the default, or approved)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			reg, o, err := w.open(cmd)
			if err != nil {
				return err
			}
			st := manifest.Status(status)
			if st == "" {
				st = manifest.Draft
			}
			ms, errs := loadManifests(args, st, nil)
			if len(errs) > 0 {
				return printInvalid(cmd, errs)
			}
			pub, err := reg.Publish(ms, manifest.Status(status), o)
			if err != nil {
				return err
			}
			for _, p := range pub {
				fmt.Fprintf(cmd.OutOrStdout(), "%s v%d %s %s\n", p.Tool, p.Version, p.Status, p.Short())
				warn(cmd, p)
			}
			return nil
		},
	}
	w.add(cmd)
	cmd.Flags().StringVar(&status, "status", "draft", "status of the new versions: draft or approved (overrides status: in the files)")
	return cmd
}

func newApproveCmd() *cobra.Command {
	var w writerFlags
	var version int
	var fourEyes bool
	cmd := &cobra.Command{
		Use:   "approve TOOL",
		Short: "Promote a draft to a new approved version",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			reg, o, err := w.open(cmd)
			if err != nil {
				return err
			}
			p, err := reg.Approve(args[0], version, fourEyes, o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s v%d approved by %s\n", p.Tool, p.Version, p.Approver)
			warn(cmd, p)
			return nil
		},
	}
	w.add(cmd)
	cmd.Flags().IntVar(&version, "version", 0, "the draft version to approve (default: the newest draft)")
	cmd.Flags().BoolVar(&fourEyes, "four-eyes", false, "refuse when the approver is the draft's author")
	return cmd
}

func newDeprecateCmd() *cobra.Command {
	var w writerFlags
	var replacedBy string
	cmd := &cobra.Command{
		Use:   "deprecate TOOL",
		Short: "Publish the newest approved version again as deprecated",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			reg, o, err := w.open(cmd)
			if err != nil {
				return err
			}
			p, err := reg.Deprecate(args[0], replacedBy, o)
			if err != nil {
				return err
			}
			line := fmt.Sprintf("%s v%d deprecated by %s", p.Tool, p.Version, p.Approver)
			if replacedBy != "" {
				line += "; use " + replacedBy
			}
			fmt.Fprintln(cmd.OutOrStdout(), line)
			warn(cmd, p)
			return nil
		},
	}
	w.add(cmd)
	cmd.Flags().StringVar(&replacedBy, "replaced-by", "", "the tool to use instead")
	return cmd
}

func newRollbackCmd() *cobra.Command {
	var w writerFlags
	var version int
	cmd := &cobra.Command{
		Use:   "rollback TOOL --version N",
		Short: "Publish an old version again as the newest, history intact",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			reg, o, err := w.open(cmd)
			if err != nil {
				return err
			}
			p, err := reg.Rollback(args[0], version, o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s v%d %s %s - %s\n", p.Tool, p.Version, p.Status, p.Short(), p.Note)
			warn(cmd, p)
			return nil
		},
	}
	w.add(cmd)
	cmd.Flags().IntVar(&version, "version", 0, "the version to publish again (required)")
	_ = cmd.MarkFlagRequired("version")
	return cmd
}

// warn prints a write's warnings on stderr.
func warn(cmd *cobra.Command, p registry.Published) {
	for _, w := range p.Warnings {
		fmt.Fprintln(cmd.ErrOrStderr(), "warning: "+w)
	}
}

func newSignCmd() *cobra.Command {
	var reg, key string
	cmd := &cobra.Command{
		Use:   "sign --key KEY",
		Short: "Sign index.json again with the next sequence, without a new version (after a key rotation, or for an index written before sequences and ids)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := registryFlag(reg)
			if err != nil {
				return err
			}
			if key == "" {
				return errors.New("manifests sign needs --key")
			}
			s, warning, err := signing.LoadSigner(key)
			if err != nil {
				return err
			}
			if warning != "" {
				fmt.Fprintln(cmd.ErrOrStderr(), warning)
			}
			seq, err := r.Sign(registry.WriteOptions{Signer: s})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "index.json sequence %d signed with key %s\n", seq, s.KeyID)
			return nil
		},
	}
	cmd.Flags().StringVar(&reg, "registry", "", "registry folder (default: manifests: in "+config.FileName+")")
	cmd.Flags().StringVar(&key, "key", "", "Ed25519 private key (PEM) to sign index.json with")
	return cmd
}

func newHistoryCmd() *cobra.Command {
	var reg string
	cmd := &cobra.Command{
		Use:   "history TOOL",
		Short: "List a tool's versions, oldest first",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := registryFlag(reg)
			if err != nil {
				return err
			}
			es, err := r.History(args[0])
			if err != nil {
				return err
			}
			for _, e := range es {
				fmt.Fprintln(cmd.OutOrStdout(), historyLine(e))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&reg, "registry", "", "registry folder (default: manifests: in "+config.FileName+")")
	return cmd
}

// historyLine is the seed's form:
// `v2 approved 2026-11-30T10:00:00Z by alice, approved by bob 5804deda419f signed - approved from v1`.
func historyLine(e registry.Entry) string {
	who := "by " + e.Author
	if e.Approver != "" && (e.Status == manifest.Approved || e.Status == manifest.Deprecated) {
		who += fmt.Sprintf(", %s by %s", e.Status, e.Approver)
	}
	line := fmt.Sprintf("v%d %s %s %s %s %s", e.Version, e.Status, e.Time.Format("2006-01-02T15:04:05Z"), who, e.Short(), signedWord(e))
	if e.Note != "" {
		line += " - " + e.Note
	}
	return line
}

func signedWord(e registry.Entry) string {
	if e.Signed() {
		return "signed"
	}
	return "unsigned"
}

func newListCmd() *cobra.Command {
	var reg string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List every tool's newest version and the version that is enforced",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := registryFlag(reg)
			if err != nil {
				return err
			}
			tools, err := r.Tools()
			if err != nil {
				return err
			}
			for _, t := range tools {
				es, _ := r.History(t)
				newest := es[len(es)-1]
				line := fmt.Sprintf("%s v%d %s %s %s", t, newest.Version, newest.Status, newest.Short(), signedWord(newest))
				if newest.Status == manifest.Draft {
					line += " (enforced: " + enforcedVersion(es) + ")"
				}
				fmt.Fprintln(cmd.OutOrStdout(), line)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&reg, "registry", "", "registry folder (default: manifests: in "+config.FileName+")")
	return cmd
}

func enforcedVersion(es []registry.Entry) string {
	for i := len(es) - 1; i >= 0; i-- {
		if es[i].Status != manifest.Draft {
			return "v" + strconv.Itoa(es[i].Version)
		}
	}
	return "none"
}

func newDiffCmd() *cobra.Command {
	var reg string
	cmd := &cobra.Command{
		Use:   "diff TOOL A B",
		Short: "Show the fields that differ between two versions of a tool",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := registryFlag(reg)
			if err != nil {
				return err
			}
			var vs [2]*registry.Version
			for i, a := range args[1:] {
				n, err := strconv.Atoi(strings.TrimPrefix(a, "v"))
				if err != nil {
					return fmt.Errorf("%q is not a version number", a)
				}
				if vs[i], err = r.ReadVersion(args[0], n); err != nil {
					return err
				}
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "--- %s v%d\n+++ %s v%d\n", args[0], vs[0].Version, args[0], vs[1].Version)
			for _, l := range diffManifests(vs[0].Manifest, vs[1].Manifest) {
				fmt.Fprintln(out, l)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&reg, "registry", "", "registry folder (default: manifests: in "+config.FileName+")")
	return cmd
}

// diffManifests lists `- path: old` / `+ path: new` for every leaf field of the manifests'
// canonical JSON that differs (a list is one leaf).
func diffManifests(a, b *manifest.Manifest) []string {
	ca, _ := manifest.CanonicalJSON(a)
	cb, _ := manifest.CanonicalJSON(b)
	return diffFlat(flattenJSON(ca, false), flattenJSON(cb, false))
}

func newVerifyCmd() *cobra.Command {
	var reg, trust string
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Check every version's file, checksum and signature; exit 1 on any problem",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := registryFlag(reg)
			if err != nil {
				return err
			}
			if !registry.IsRegistry(r.Dir) {
				return fmt.Errorf("%s is not a registry (no %s)", r.Dir, registry.IndexFile)
			}
			ts, err := trustFlag(trust)
			if err != nil {
				return err
			}
			rep, errs := r.Verify(ts)
			out := cmd.OutOrStdout()
			for _, e := range errs {
				fmt.Fprintln(out, e)
			}
			if len(errs) > 0 {
				fmt.Fprintf(out, "FAIL: %d %s in %s\n", len(errs), plural(len(errs), "problem", "problems"), r.Dir)
				return exitError{1}
			}
			how := "signatures not checked: no trusted key (pass --trust or set manifest_public_key)"
			if ts != nil {
				how = fmt.Sprintf("every signature checked against %d trusted %s", len(ts.KeyIDs()), plural(len(ts.KeyIDs()), "key", "keys"))
			}
			fmt.Fprintf(out, "ok: %d tools, %d versions (%d signed), %s\n", rep.Tools, rep.Versions, rep.Signed, how)
			return nil
		},
	}
	cmd.Flags().StringVar(&reg, "registry", "", "registry folder (default: manifests: in "+config.FileName+")")
	cmd.Flags().StringVar(&trust, "trust", "", "PEM file of trusted public keys (default: manifest_public_key or $"+config.TrustedKeysEnv+")")
	return cmd
}

// trustFlag is --trust, or the project's trusted keys.
func trustFlag(path string) (*signing.TrustSet, error) {
	if path != "" {
		return signing.LoadTrustSet(path)
	}
	return projectTrust()
}

func newCheckCmd() *cobra.Command {
	cmd := newValidateCmd()
	cmd.Use = "check [PATH...]"
	cmd.Short = "Validate plain manifest files (same as reversi validate)"
	return cmd
}

// printInvalid prints validation errors and the count, and ends with exit 1.
func printInvalid(cmd *cobra.Command, errs []error) error {
	for _, e := range errs {
		fmt.Fprintln(cmd.ErrOrStderr(), e)
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "invalid: %d %s\n", len(errs), plural(len(errs), "error", "errors"))
	return exitError{1}
}
