package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// BenchmarkPassedResult is the gateway's own work on one passed-through result, as the stdio
// fast path does it: the line's parse (deliverRaw), lightResult (which also tells a final
// result), and the reply's splice of resultType and the server's _meta entry (a client of the
// newest protocol), then the line-end check. prescan=completeResult adds what the path did
// until 2026-12-04 to tell a final result: completeResult's scans of the result's bytes. The
// result is what server-memory's read_graph answers for hack/bench's graph (20 entities of 3
// observations, 20 relations; about 10 KB, the text block a 6.5 KB string of escapes). One op
// is one result; B/op and allocs/op are what the collector then pays for.
func BenchmarkPassedResult(b *testing.B) {
	line := readGraphLine(b)
	info, _ := json.Marshal(&mcp.Implementation{Name: Name, Version: Version})
	set := resultAdditions{ResultType: json.RawMessage(`"complete"`), Meta: map[string]json.RawMessage{mcp.MetaKeyServerInfo: info}}
	for _, prescan := range []bool{false, true} {
		b.Run(map[bool]string{false: "prescan=none", true: "prescan=completeResult"}[prescan], func(b *testing.B) {
			b.SetBytes(int64(len(line)))
			b.ReportAllocs()
			for b.Loop() {
				m, err := parseRawLine(line)
				if err != nil {
					b.Fatal(err)
				}
				if prescan && !completeResult(m.Result) {
					b.Fatal("not complete")
				}
				res, env, err := lightResult(m.Result)
				if err != nil || res.StructuredContent == nil || env.incomplete {
					b.Fatal(res, env, err)
				}
				body, err := set.splice(m.Result, env)
				if err != nil || hasLineEnd(body) {
					b.Fatal(err)
				}
			}
		})
	}
}

// readGraphLine is the line server-memory writes for a read_graph of benchGraph (hack/bench's
// graph): the graph pretty-printed (JSON.stringify(graph, null, 2)) in a text block, and as
// structuredContent.
func readGraphLine(tb testing.TB) []byte {
	g := map[string][]map[string]any{"entities": {}, "relations": {}}
	for _, l := range bytes.Split(bytes.TrimSpace(benchGraph()), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			tb.Fatal(err)
		}
		kind := map[any]string{"entity": "entities", "relation": "relations"}[m["type"]]
		delete(m, "type") // server-memory answers without it
		g[kind] = append(g[kind], m)
	}
	text, err := json.MarshalIndent(g, "", "  ")
	if err != nil {
		tb.Fatal(err)
	}
	res, err := json.Marshal(map[string]any{"content": []any{map[string]any{"type": "text", "text": string(text)}}, "structuredContent": g})
	if err != nil {
		tb.Fatal(err)
	}
	return fmt.Appendf(nil, `{"result":%s,"jsonrpc":"2.0","id":"%s1"}`, res, rawIDPrefix)
}
