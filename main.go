// Command reversi is the Reversi GitOps binary: manifest tooling for PR pipelines
// (validate, lint, test) and, in later releases, the controller and the gateway.
package main

import (
	"os"

	"github.com/reversi-gitops/reversi/internal/cli"
)

func main() {
	os.Exit(cli.Execute(os.Args[1:], os.Stdout, os.Stderr))
}
