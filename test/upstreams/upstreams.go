// Package upstreams gives tests the command lines of real MCP servers from the npm registry
// (@modelcontextprotocol/server-memory, server-filesystem, server-everything) and of clients
// of another implementation (ts-client.mjs and ts-relay.mjs, on @modelcontextprotocol/sdk),
// all pinned in this folder's package.json and package-lock.json. It also starts
// server-everything over Streamable HTTP on loopback (StartEverythingHTTP) and runs the MCP
// conformance suite's server scenarios against an endpoint (RunConformance).
//
// hack/upstreams.sh installs them (npm ci) into test/upstreams/node_modules; `make test` runs
// it and exports the folder as REVERSI_UPSTREAMS. A plain `go test` finds the same folder next
// to this file, so after one `hack/upstreams.sh` the tests also run without make. When the
// packages are missing the helpers fail the test (they never skip): a test that silently does
// not run against the real servers is worse than a red one.
//
// Every helper returns the absolute path of node, the arguments (the package's bin script
// first) and the environment the server needs, nothing inherited: pass env as exec.Cmd.Env
// (append os.Environ() to it only if the test wants the parent's environment).
package upstreams

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Package names, as in package.json.
const (
	MemoryPackage     = "@modelcontextprotocol/server-memory"
	FilesystemPackage = "@modelcontextprotocol/server-filesystem"
	EverythingPackage = "@modelcontextprotocol/server-everything"
	SDKPackage        = "@modelcontextprotocol/sdk"
)

// EnvDir names the environment variable holding the node_modules folder (set by `make test`).
const EnvDir = "REVERSI_UPSTREAMS"

const installHint = "run hack/upstreams.sh (make test does) to install the pinned MCP servers from test/upstreams/package-lock.json"

// srcDir is this package's folder (test/upstreams), where ts-client.mjs lives.
func srcDir(t testing.TB) string {
	t.Helper()
	dir, err := sourceDir()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// Dir returns the node_modules folder holding the packages: $REVERSI_UPSTREAMS, or
// test/upstreams/node_modules. It fails the test if the folder does not exist.
func Dir(t testing.TB) string {
	t.Helper()
	dir, err := FindDir()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

var nodeOnce = sync.OnceValues(func() (string, error) {
	path, err := exec.LookPath("node")
	if err != nil {
		return "", err
	}
	out, err := exec.Command(path, "-p", "process.versions.node").Output()
	if err != nil {
		return "", err
	}
	v := strings.TrimSpace(string(out))
	major, err := strconv.Atoi(strings.SplitN(v, ".", 2)[0])
	if err != nil || major < 20 {
		return "", &versionError{v}
	}
	return filepath.Abs(path)
})

type versionError struct{ v string }

func (e *versionError) Error() string { return "node " + e.v + " is too old, need >= 20" }

// Node returns the absolute path of the node binary (Node.js >= 20), failing the test otherwise.
func Node(t testing.TB) string {
	t.Helper()
	path, err := FindNode()
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// Bin returns the absolute path of the JavaScript file the package declares in its
// package.json `bin` (the first one by name when there are several).
func Bin(t testing.TB, pkg string) string {
	t.Helper()
	script, err := FindBin(pkg)
	if err != nil {
		t.Fatal(err)
	}
	return script
}

// Memory returns the command line of @modelcontextprotocol/server-memory (stdio), storing its
// knowledge graph in a file in t.TempDir() so that nothing is written outside the test.
func Memory(t testing.TB) (cmd string, args []string, env []string) {
	t.Helper()
	return MemoryAt(t, filepath.Join(t.TempDir(), "memory.jsonl"))
}

// MemoryAt is Memory with the knowledge graph in file (MEMORY_FILE_PATH, JSON lines), for tests
// that inspect the upstream's state or share it between several server processes.
func MemoryAt(t testing.TB, file string) (cmd string, args []string, env []string) {
	t.Helper()
	abs, err := filepath.Abs(file)
	if err != nil {
		t.Fatalf("upstreams: %s: %v", file, err)
	}
	return Node(t), []string{Bin(t, MemoryPackage)}, []string{"MEMORY_FILE_PATH=" + abs}
}

// Filesystem returns the command line of @modelcontextprotocol/server-filesystem (stdio),
// allowed to access root (and roots, if any) only.
func Filesystem(t testing.TB, root string, roots ...string) (cmd string, args []string, env []string) {
	t.Helper()
	args = []string{Bin(t, FilesystemPackage)}
	for _, r := range append([]string{root}, roots...) {
		abs, err := filepath.Abs(r)
		if err != nil {
			t.Fatalf("upstreams: %s: %v", r, err)
		}
		args = append(args, abs)
	}
	return Node(t), args, []string{}
}

// Everything returns the command line of @modelcontextprotocol/server-everything over stdio.
func Everything(t testing.TB) (cmd string, args []string, env []string) {
	t.Helper()
	return Node(t), []string{Bin(t, EverythingPackage), "stdio"}, []string{}
}

// TSClient returns the command line of ts-client.mjs, the MCP client on the TypeScript SDK
// (@modelcontextprotocol/sdk). Append its arguments (see the usage in ts-client.mjs), e.g.
// "--", server, args... for a stdio server, or "--url", url for Streamable HTTP. It prints one
// JSON object on stdout: {"tools": [names...]} and, with --call, "result".
//
// The script resolves the SDK from test/upstreams/node_modules (next to it), whatever
// REVERSI_UPSTREAMS says.
func TSClient(t testing.TB) (cmd string, args []string) {
	t.Helper()
	dir := srcDir(t)
	sdk := filepath.Join(dir, "node_modules", filepath.FromSlash(SDKPackage), "package.json")
	if _, err := os.Stat(sdk); err != nil {
		t.Fatalf("upstreams: %s is not installed next to ts-client.mjs: %v; %s", SDKPackage, err, installHint)
	}
	return Node(t), []string{filepath.Join(dir, "ts-client.mjs")}
}

// Command builds an exec.Cmd from a helper's results, with exactly env as its environment.
func Command(cmd string, args, env []string) *exec.Cmd {
	c := exec.Command(cmd, args...)
	c.Env = append([]string{}, env...)
	return c
}
