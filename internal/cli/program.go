package cli

import (
	"io"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
)

// GatewayProgram is the gateway's own program name (seed "MCP gateway": "`reversi-gateway` is
// an MCP server ... The same program runs as `reversi gateway ...`").
const GatewayProgram = "reversi-gateway"

// Main runs the binary as the name it was invoked by: argv[0] whose base name is
// reversi-gateway (a copy, a symlink or `go install ./cmd/reversi-gateway`) runs the gateway
// command directly, anything else the `reversi` root. argv is os.Args (argv[0] first); the
// result is the process exit code, as Execute's.
func Main(argv []string, stdout, stderr io.Writer) int {
	if len(argv) == 0 {
		return Execute(nil, stdout, stderr)
	}
	if IsGatewayProgram(argv[0]) {
		return ExecuteGateway(argv[1:], stdout, stderr)
	}
	return Execute(argv[1:], stdout, stderr)
}

// IsGatewayProgram reports whether a program path names the gateway: its base name, without a
// ".exe" suffix, is GatewayProgram.
func IsGatewayProgram(argv0 string) bool {
	base := filepath.Base(argv0)
	base = strings.TrimSuffix(strings.TrimSuffix(base, ".exe"), ".EXE")
	return base == GatewayProgram
}

// NewGatewayRoot builds the reversi-gateway command: the gateway command of `reversi gateway`
// as a root of its own, so `reversi-gateway --help` lists the gateway's flags.
func NewGatewayRoot() *cobra.Command {
	cmd := newGatewayCmd()
	cmd.Use = GatewayProgram
	cmd.SilenceUsage = true
	cmd.SilenceErrors = true
	return cmd
}

// ExecuteGateway runs reversi-gateway with args (without the program name) and returns the
// exit code: 0 on success, 1 on any problem (printed on stderr as "error: ...").
func ExecuteGateway(args []string, stdout, stderr io.Writer) int {
	return run(NewGatewayRoot(), args, stdout, stderr)
}
