package upstreams

import (
	"os"
	"path/filepath"
	"testing"
)

// sdkScript returns the absolute path of a script of this folder that imports
// @modelcontextprotocol/sdk (resolved from test/upstreams/node_modules next to it), failing the
// test when the SDK is not installed there.
func sdkScript(t testing.TB, name string) string {
	t.Helper()
	dir := srcDir(t)
	if _, err := os.Stat(filepath.Join(dir, "node_modules", filepath.FromSlash(SDKPackage), "package.json")); err != nil {
		t.Fatalf("upstreams: %s is not installed next to %s: %v; %s", SDKPackage, name, err, installHint)
	}
	return filepath.Join(dir, name)
}

// BadOutput returns the command line of bad-output-server.mjs: a real MCP server (stdio, the
// TypeScript SDK's low-level Server) whose tool "weather" declares an outputSchema and returns
// structuredContent that breaks it, and whose tool "ping" answers "pong". It injects the one
// fault the npm servers cannot produce on demand.
func BadOutput(t testing.TB) (cmd string, args []string, env []string) {
	t.Helper()
	return Node(t), []string{sdkScript(t, "bad-output-server.mjs")}, []string{}
}

// CountCallsEnv returns the environment that makes a Node MCP server count the tools/call
// requests it receives: NODE_OPTIONS preloads count-calls.mjs, which appends one line (the tool
// name) per request to file. Add it to a stdio upstream's env; the server itself is unchanged.
func CountCallsEnv(t testing.TB, file string) []string {
	t.Helper()
	abs, err := filepath.Abs(file)
	if err != nil {
		t.Fatalf("upstreams: %s: %v", file, err)
	}
	return []string{"NODE_OPTIONS=--import=" + filepath.Join(srcDir(t), "count-calls.mjs"), "REVERSI_COUNT_CALLS=" + abs}
}
