// Command demo is `make demo`: the story of Reversi GitOps on an embedded control plane, told
// with the real kubectl, git and reversi commands it runs (internal/demo). It builds what it
// needs (hack/setup-envtest.sh, hack/upstreams.sh, bin/reversi) and leaves nothing running.
//
//	go run ./hack/demo [--keep DIR]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/reversi-gitops/reversi/internal/demo"
)

func main() {
	keep := flag.String("keep", "", "work in this folder and keep it afterwards (kubeconfigs, repository, logs)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	_, err := demo.Run(ctx, demo.Options{Out: os.Stdout, Dir: *keep, Keep: *keep != ""})
	if err != nil {
		fmt.Fprintln(os.Stderr, "\ndemo failed:", err)
		os.Exit(1)
	}
}
