package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/internal/config"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/signing"
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
			ms, err := loadValid(cmd, args)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "ok: %d tool manifests valid\n", len(ms))
			return nil
		},
	}
}

// LoadManifests reads and validates the manifests under paths: every syntax, field and
// cross-manifest error together, ordered by file and line. A path that is a registry folder
// contributes its loaded versions (newest non-draft, checksums and, with the project's trusted
// keys, signatures checked). Trusted keys set for a path that is not a registry are an error
// (registry.PlainTrustError): plain files carry no signatures to check.
func LoadManifests(paths ...string) ([]*manifest.Manifest, []error) {
	return loadManifests(paths, "", nil)
}

// loadManifests is LoadManifests, or with publish set (the --status of manifests publish) the
// reading of the files publish is about to sign into a registry: the project's trusted keys
// are for that registry, not a reason to refuse its sources, and the cross-manifest rules
// judge the files with the status publish writes.
func loadManifests(paths []string, publish manifest.Status, marks *[]store.HighWater) ([]*manifest.Manifest, []error) {
	return loadManifestsAndPolicies(paths, publish, marks, nil)
}

// loadManifestsAndPolicies is loadManifests that also appends the served (verified) policies
// of every registry among paths to policies, when it is not nil.
func loadManifestsAndPolicies(paths []string, publish manifest.Status, marks *[]store.HighWater, policies *[]*apipolicy.Policy) ([]*manifest.Manifest, []error) {
	var plain []string
	var ms []*manifest.Manifest
	var errs []error
	setting := ""
	if publish == "" {
		c, err := config.Find()
		if err != nil {
			return nil, []error{err}
		}
		setting = c.TrustedKeysSetting()
	}
	for _, p := range paths {
		if !registry.IsRegistry(p) {
			if _, err := os.Stat(p); err == nil && setting != "" { // a missing path is reported as such
				errs = append(errs, &registry.PlainTrustError{Manifests: p, Setting: setting})
				continue
			}
			plain = append(plain, p)
			continue
		}
		trust, err := projectTrust()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		snap, rerrs := registry.New(p).Load(trust)
		errs = append(errs, rerrs...)
		if snap != nil {
			ms = append(ms, snap.Manifests...)
			if policies != nil {
				*policies = append(*policies, snap.Policies...)
			}
			if marks != nil && trust != nil { // a signed index: its sequence and id may be trusted
				abs, _ := filepath.Abs(p)
				*marks = append(*marks,
					store.HighWater{Source: "registry " + abs, Sequence: snap.Index.Sequence, Digest: markDigest(snap)},
					// The folder's registry, pinned: one sequence, so another id at the path is refused.
					store.HighWater{Source: "registry " + abs + " (its id)", Sequence: 1, Digest: "id:" + snap.Index.ID})
			}
		}
	}
	docs, perrs := manifest.ReadPaths(plain...)
	pms, verrs := manifest.ValidateDocumentsAs(docs, publish)
	errs = append(append(errs, perrs...), verrs...)
	manifest.SortErrors(errs)
	ms = append(ms, pms...)
	if len(ms) == 0 && len(errs) == 0 {
		// A wrong path must not pass a pipeline as "ok: 0".
		errs = append(errs, fmt.Errorf("%w in %s: check the path (folders are read for *.json, *.yaml and *.yml)", errNoManifests, strings.Join(paths, ", ")))
	}
	return ms, errs
}

// errNoManifests: a selection that holds no manifest at all.
var errNoManifests = errors.New("no tool manifests found")

// loadValid loads the manifests under args (or the configured ones) and, when anything is
// wrong, prints every error and returns the exit-1 error.
func loadValid(cmd *cobra.Command, args []string) ([]*manifest.Manifest, error) {
	paths, err := config.ManifestPaths(args)
	if err != nil {
		return nil, err
	}
	ms, errs := LoadManifests(paths...)
	if len(errs) > 0 {
		return nil, printInvalid(cmd, errs)
	}
	return ms, nil
}

// projectTrust is the trusted manifest keys of the project config, nil when none is set.
func projectTrust() (*signing.TrustSet, error) {
	c, err := config.Find()
	if err != nil {
		return nil, err
	}
	return c.TrustedKeys()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// markDigest is what a registry's high-water mark records of a load: the digest of its served
// manifests and, when it serves policies, theirs.
func markDigest(snap *registry.Snapshot) string {
	d := registry.SetDigest(snap.Entries)
	if p := registry.PolicyDigest(snap.PolicyEntries); p != "" {
		d += " policies " + p
	}
	return d
}
