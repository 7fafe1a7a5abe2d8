package proxy

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// decodeSeeds are messages where a decoder of its own could read otherwise than the SDK's:
// member case, id types, version tags, duplicate members, nesting, space and trailing bytes.
var decodeSeeds = []string{
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_graph","arguments":{}}}`,
	`{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"x"}}`,
	`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}`,
	`{"jsonrpc":"2.0","id":7,"result":{"content":[]}}`,
	`{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"no","data":{"x":1}}}`,
	`{"jsonrpc":"2.0","id":7}`,
	`{"jsonrpc":"2.0","id":null,"result":{}}`,
	`{"jsonrpc":"2.0","result":{}}`,
	`{"jsonrpc":"1.0","id":1,"method":"ping"}`,
	`{"JSONRPC":"2.0","id":1,"method":"ping"}`,
	`{"jsonrpc":"2.0","ID":1,"Method":"ping"}`,
	`{"jsonrpc":"2.0","id":1,"method":"ping","Params":{"a":1}}`,
	`{"jsonrpc":"2.0","id":1.5,"method":"ping"}`,
	`{"jsonrpc":"2.0","id":1e300,"method":"ping"}`,
	`{"jsonrpc":"2.0","id":-0,"method":"ping"}`,
	`{"jsonrpc":"2.0","id":true,"method":"ping"}`,
	`{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}`,
	`{"jsonrpc":"2.0","id":[1],"method":"ping"}`,
	`{"jsonrpc":"2.0","id":1,"method":5}`,
	`{"jsonrpc":"2.0","id":1,"method":""}`,
	`{"jsonrpc":"2.0","id":1,"method":null}`,
	`{"jsonrpc":"2.0","id":1,"method":"a","method":"tools/call"}`,
	`{"jsonrpc":"2.0","id":1,"id":"b","method":"ping"}`,
	`{"jsonrpc":"2.0","id":1,"method":"ping","params":null}`,
	`{"jsonrpc":"2.0","id":1,"method":"ping","params":[1,2]}`,
	`{"jsonrpc":"2.0","id":1,"method":"ping","result":{},"error":{"code":1,"message":"m"}}`,
	`{"jsonrpc":"2.0","id":1,"error":{"code":"x","message":"m"}}`,
	`{"jsonrpc":"2.0","id":1,"error":null}`,
	`  {"jsonrpc":"2.0","id":1,"method":"ping"}  `,
	`{"jsonrpc":"2.0","id":1,"method":"ping"} trailing`,
	`{"jsonrpc":"2.0","id":1,"method":"ping"`,
	`{"jsonrpc":"2.0","id":"\u00e9\ud83d\ude00","method":"p\u0069ng"}`,
	`{"jsonrpc":"2.0","id":1,"method":"ping","params":{"s":"\"{[{["}}`,
	`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`,
	`null`, `""`, `1`, `{}`, ``,
	`{"jsonrpc":"2.0","id":1,"method":"ping","params":` + strings.Repeat("[", 998) + strings.Repeat("]", 998) + `}`,
	`{"jsonrpc":"2.0","id":1,"method":"ping","params":` + strings.Repeat("[", 1000) + strings.Repeat("]", 1000) + `}`,
	`{"jsonrpc":"2.0","id":1,"method":"ping","params":"` + strings.Repeat("{", 1200) + `"}`,
}

// FuzzDecodeMessageAsTheSDK holds decodeMessage to jsonrpc.DecodeMessage: the same message
// (type, id, method, params, result, error) or an error both times, with the SDK's text.
func FuzzDecodeMessageAsTheSDK(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		want, werr := jsonrpc.DecodeMessage(data)
		got, gerr := decodeMessage(data)
		if (werr == nil) != (gerr == nil) || werr != nil && werr.Error() != gerr.Error() {
			t.Fatalf("%q: error %v, the SDK's %v", data, gerr, werr)
		}
		if werr != nil {
			return
		}
		if reflect.TypeOf(got) != reflect.TypeOf(want) {
			t.Fatalf("%q: a %T, the SDK's a %T", data, got, want)
		}
		switch w := want.(type) {
		case *jsonrpc.Request:
			g := got.(*jsonrpc.Request)
			if g.ID != w.ID || g.Method != w.Method || !bytes.Equal(g.Params, w.Params) {
				t.Fatalf("%q: %+v, the SDK's %+v", data, g, w)
			}
		case *jsonrpc.Response:
			g := got.(*jsonrpc.Response)
			if g.ID != w.ID || !bytes.Equal(g.Result, w.Result) || !reflect.DeepEqual(g.Error, w.Error) {
				t.Fatalf("%q: %+v, the SDK's %+v", data, g, w)
			}
		}
	})
}

// TestDecodeMessageAllocatesNoReadBuffer is why decodeMessage exists: the SDK's decoder takes
// a 32 KB buffer for every message.
func TestDecodeMessageAllocatesNoReadBuffer(t *testing.T) {
	msg := []byte(decodeSeeds[0])
	sdk := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = jsonrpc.DecodeMessage(msg)
		}
	})
	ours := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = decodeMessage(msg)
		}
	})
	if sdk.AllocedBytesPerOp() < 32<<10 {
		t.Fatalf("the SDK's DecodeMessage allocates %d bytes per message: no read buffer to save any more", sdk.AllocedBytesPerOp())
	}
	if ours.AllocedBytesPerOp() > 2<<10 {
		t.Fatalf("decodeMessage allocates %d bytes per message, want at most 2 KB (the SDK's: %d)", ours.AllocedBytesPerOp(), sdk.AllocedBytesPerOp())
	}
}
