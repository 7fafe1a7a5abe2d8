// Command bench runs the project's benchmarks that need more than `go test -bench`: several
// processes, real transports, a table side by side. Run it from the module root:
//
//	go run ./hack/bench gateway [flags]
//
// Subcommands:
//
//	gateway   read_graph of @modelcontextprotocol/server-memory direct, through the floor relay,
//	          a naive go-sdk proxy, the npm proxies mcp-proxy and supergateway, and the reversi
//	          gateway (stdio and Streamable HTTP; SQLite, memory store, PostgreSQL): calls/s,
//	          p50/p99, proxy CPU per call; 3 repetitions (issues 5 and 20)
//	suite     every figure of issues 10 and 20 side by side with its baseline; writes
//	          BENCHMARKS.md (`make bench`)
//	auth-load 200 concurrent authenticated HTTP sessions (API keys and OIDC) for 60 s: no
//	          error, goroutines and heap back to the baseline (issue 7)
//	hostile-client
//	          a gateway process's idle and peak RSS under hostile clients on 127.0.0.1:
//	          batches, oversized bodies, slow bodies (issue 18)
//	hostile-upstream
//	          a gateway process's idle and peak RSS in front of a hostile upstream: listings,
//	          framing faults, oversized answers, hangs, crashes (issue 18)
//
// Hidden subcommands, which the gateway rows run as their own processes (so that their CPU is
// theirs): `floor [-journal FILE] -- server args...` (floor.go) and `naive-proxy -- server
// args...` (naive.go).
//
// The figures are recorded in BENCHMARKS.md.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: go run ./hack/bench suite|gateway|auth-load|hostile-client|hostile-upstream [flags]  (-h for the flags)")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "gateway":
		err = gatewayMain(os.Args[2:])
	case "auth-load":
		err = authLoadMain(os.Args[2:])
	case "suite":
		err = suiteMain(os.Args[2:])
	case "hostile-client":
		err = hostileMain(os.Args[2:])
	case "hostile-upstream":
		err = hostileUpstreamMain(os.Args[2:])
	case "floor":
		err = floorMain(os.Args[2:])
	case "naive-proxy":
		err = naiveProxyMain(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "bench: unknown subcommand %q; use suite, gateway, auth-load, hostile-client or hostile-upstream\n", os.Args[1])
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
