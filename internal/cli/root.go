// Package cli holds the cobra commands of the `reversi` binary. Commands only wire the
// project's packages together; the rules live in those packages.
package cli

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// commands are the constructors of the root's subcommands, one per file of this package.
var commands []func() *cobra.Command

func register(c func() *cobra.Command) { commands = append(commands, c) }

// exitError ends the program with code after the command has printed its own report.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// NewRoot builds the `reversi` command with every subcommand.
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "reversi",
		Short:         "Reviewed, signed tool manifests for AI agents' MCP tool calls",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	for _, c := range commands {
		root.AddCommand(c())
	}
	return root
}

// Execute runs the CLI with args and returns the process exit code: 0 on success, 1 on any
// problem (a command that found problems has printed them itself).
func Execute(args []string, stdout, stderr io.Writer) int {
	return run(NewRoot(), args, stdout, stderr)
}

// run executes root with args and maps its error to an exit code (see Execute).
func run(root *cobra.Command, args []string, stdout, stderr io.Writer) int {
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	default:
		fmt.Fprintln(stderr, "error:", err)
		return 1
	}
}
