package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func init() { register(newVersionCmd) }

// Version is what `reversi version` prints: the module version, the VCS commit and the Go
// toolchain, from the build information the go command embeds (runtime/debug.ReadBuildInfo).
// A build outside a git checkout (or with -buildvcs=false) has no commit: "unknown".
type Version struct {
	// Module is the main module's version: a tag (v1.2.3), a pseudo-version, or "(devel)".
	Module string
	// Commit is vcs.revision (40 hex digits), with Modified set when the tree was dirty.
	Commit   string
	Modified bool
	// Go is the toolchain that built the binary (go1.26.x).
	Go string
}

// BuildVersion reads the running binary's Version.
func BuildVersion() Version {
	v := Version{Module: "(devel)", Commit: "unknown", Go: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if bi.Main.Version != "" {
		v.Module = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

// String is "reversi <module> (commit <hash>[, modified]; <go>)".
func (v Version) String() string {
	commit := v.Commit
	if v.Modified {
		commit += ", modified"
	}
	return fmt.Sprintf("reversi %s (commit %s; %s)", v.Module, commit, v.Go)
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go toolchain this binary was built from",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), BuildVersion())
			return err
		},
	}
}
