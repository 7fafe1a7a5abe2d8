package cli

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
	"github.com/reversi-gitops/reversi/internal/config"
	"github.com/reversi-gitops/reversi/pkg/policy"
	"github.com/reversi-gitops/reversi/pkg/registry"
)

func init() { register(newPolicyCmd) }

// newPolicyCmd is `reversi policy`: policies are versioned and signed in the manifest
// registry like manifests (issue 21, GitOps), with the same keys, the same four-eyes rule and
// the same index.
func newPolicyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Publish, approve, inspect and verify policy versions in the signed manifest registry",
	}
	cmd.AddCommand(newPolicyPublishCmd(), newPolicyApproveCmd(), newPolicyHistoryCmd(), newPolicyDiffCmd(), newPolicyVerifyCmd())
	return cmd
}

func newPolicyPublishCmd() *cobra.Command {
	var w writerFlags
	var status string
	cmd := &cobra.Command{
		Use:   "publish PATH...",
		Short: "Add policy files or folders as new versions (--status draft, the default, or approved)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			reg, o, err := w.open(cmd)
			if err != nil {
				return err
			}
			ps, errs := apipolicy.ReadPaths(args...)
			if len(errs) == 0 {
				_, errs = policy.Compile(ps) // every CEL error at once, with file:line
			}
			if len(errs) == 0 && len(ps) == 0 {
				errs = []error{fmt.Errorf("no policy found in %s: check the path (folders are read for *.json, *.yaml and *.yml)", strings.Join(args, ", "))}
			}
			if len(errs) > 0 {
				return printInvalid(cmd, errs)
			}
			pub, err := reg.PublishPolicies(ps, manifest.Status(status), o)
			if err != nil {
				return err
			}
			for _, p := range pub {
				fmt.Fprintf(cmd.OutOrStdout(), "%s v%d %s %s\n", p.Name, p.Version, p.Status, p.Short())
			}
			return nil
		},
	}
	w.add(cmd)
	cmd.Flags().StringVar(&status, "status", "draft", "status of the new versions: draft or approved")
	return cmd
}

func newPolicyApproveCmd() *cobra.Command {
	var w writerFlags
	var version int
	var fourEyes bool
	cmd := &cobra.Command{
		Use:   "approve NAME",
		Short: "Promote a policy draft to a new approved version",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			reg, o, err := w.open(cmd)
			if err != nil {
				return err
			}
			p, err := reg.ApprovePolicy(args[0], version, fourEyes, o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s v%d approved by %s\n", p.Name, p.Version, p.Approver)
			return nil
		},
	}
	w.add(cmd)
	cmd.Flags().IntVar(&version, "version", 0, "the draft version to approve (default: the newest version, when it is a draft)")
	cmd.Flags().BoolVar(&fourEyes, "four-eyes", false, "refuse when the approver is the draft's author")
	return cmd
}

func newPolicyHistoryCmd() *cobra.Command {
	var reg string
	cmd := &cobra.Command{
		Use:   "history NAME",
		Short: "List a policy's versions, oldest first",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := registryFlag(reg)
			if err != nil {
				return err
			}
			es, err := r.PolicyHistory(args[0])
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

func newPolicyDiffCmd() *cobra.Command {
	var reg string
	cmd := &cobra.Command{
		Use:   "diff NAME A B",
		Short: "Show the fields that differ between two versions of a policy",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := registryFlag(reg)
			if err != nil {
				return err
			}
			var vs [2]*registry.PolicyVersion
			for i, a := range args[1:] {
				n, err := strconv.Atoi(strings.TrimPrefix(a, "v"))
				if err != nil {
					return fmt.Errorf("%q is not a version number", a)
				}
				if vs[i], err = r.ReadPolicyVersion(args[0], n); err != nil {
					return err
				}
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "--- %s v%d\n+++ %s v%d\n", args[0], vs[0].Version, args[0], vs[1].Version)
			for _, l := range diffFlat(flattenJSON(vs[0].Canonical, true), flattenJSON(vs[1].Canonical, true)) {
				fmt.Fprintln(out, l)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&reg, "registry", "", "registry folder (default: manifests: in "+config.FileName+")")
	return cmd
}

func newPolicyVerifyCmd() *cobra.Command {
	var reg, trust string
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Check every policy and manifest version's file, checksum and signature, and the index; exit 1 on any problem",
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
			if len(errs) == 0 { // the served policies must also compile together, as a load checks
				if _, lerrs := r.Load(ts); len(lerrs) > 0 {
					errs = lerrs
				}
			}
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
			fmt.Fprintf(out, "ok: %d %s, %d versions (%d signed); %d tools, %d versions (%d signed); %s\n",
				rep.Policies, plural(rep.Policies, "policy", "policies"), rep.PolicyVersions, rep.PolicySigned, rep.Tools, rep.Versions, rep.Signed, how)
			return nil
		},
	}
	cmd.Flags().StringVar(&reg, "registry", "", "registry folder (default: manifests: in "+config.FileName+")")
	cmd.Flags().StringVar(&trust, "trust", "", "PEM file of trusted public keys (default: manifest_public_key or $"+config.TrustedKeysEnv+")")
	return cmd
}

// flattenJSON maps each leaf of a JSON document to its JSON text, by path: `a.b`, and with
// intoLists `rules[0].effect` (else a list is one leaf).
func flattenJSON(b []byte, intoLists bool) map[string]string {
	var v any
	_ = json.Unmarshal(b, &v)
	out := map[string]string{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(strings.TrimPrefix(prefix+"."+k, "."), e)
			}
		case []any:
			if !intoLists {
				j, _ := json.Marshal(x)
				out[prefix] = string(j)
				return
			}
			for i, e := range x {
				walk(fmt.Sprintf("%s[%d]", prefix, i), e)
			}
			if len(x) == 0 {
				out[prefix] = "[]"
			}
		default:
			j, _ := json.Marshal(x)
			out[prefix] = string(j)
		}
	}
	walk("", v)
	return out
}

// diffFlat lists `- path: old` / `+ path: new` for every leaf that differs, by path.
func diffFlat(fa, fb map[string]string) []string {
	keys := map[string]bool{}
	for k := range fa {
		keys[k] = true
	}
	for k := range fb {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	var out []string
	for _, k := range sorted {
		va, inA := fa[k]
		vb, inB := fb[k]
		if inA && inB && va == vb {
			continue
		}
		if inA {
			out = append(out, fmt.Sprintf("- %s: %s", k, va))
		}
		if inB {
			out = append(out, fmt.Sprintf("+ %s: %s", k, vb))
		}
	}
	return out
}
