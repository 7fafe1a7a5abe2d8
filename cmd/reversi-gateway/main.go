// Command reversi-gateway is the MCP gateway on its own name (seed "MCP gateway": "The same
// program runs as `reversi gateway ...`"): `go install ./cmd/reversi-gateway`. It is the
// `reversi gateway` command as a root, with the same flags; the `reversi` binary behaves the
// same when invoked through a copy or symlink named reversi-gateway.
package main

import (
	"os"

	"github.com/reversi-gitops/reversi/internal/cli"
)

func main() {
	os.Exit(cli.ExecuteGateway(os.Args[1:], os.Stdout, os.Stderr))
}
