// Command reversi is the Reversi GitOps binary: manifest tooling for PR pipelines
// (validate, lint, test), the controller and the gateway. Invoked as reversi-gateway (a copy
// or symlink) it is the gateway command itself.
package main

import (
	"os"

	"github.com/reversi-gitops/reversi/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args, os.Stdout, os.Stderr))
}
