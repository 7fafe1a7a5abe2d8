package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// TestIDScanner: the streaming scan finds the top-level id wherever it is, whatever the values
// around it hold (nested ids, braces and quotes in strings, escapes), fed in pieces of any size.
func TestIDScanner(t *testing.T) {
	big := strings.Repeat(`y\"{[`, 1000)
	cases := []struct {
		name, msg string
		id        any // nil: none found
		method    bool
	}{
		{"id first", `{"jsonrpc":"2.0","id":7,"result":{"content":[]}}`, int64(7), false},
		{"id last", `{"jsonrpc":"2.0","result":{"id":1,"content":[{"text":"` + big + `"}]},"id":42}`, int64(42), false},
		{"string id", `{"id":"abc\"d","result":{}}`, `abc"d`, false},
		{"spaces", "{ \"result\" : [ {\"id\":3} ] , \"id\" : 9 }", int64(9), false},
		{"nested only", `{"result":{"id":5}}`, nil, false},
		{"escaped key", `{"i\u0064":5}`, nil, false},
		{"request", `{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage","params":{"x":"` + big + `"}}`, int64(3), true},
		{"not an object", `[{"id":1}]`, nil, false},
		{"not JSON", `hello {"id":1}`, nil, false},
		{"object id", `{"id":{"x":1},"result":{}}`, nil, false},
		{"null id", `{"id":null,"error":{}}`, nil, false},
		{"duplicate id", `{"id":1,"result":{},"id":2}`, int64(2), false},
	}
	for _, c := range cases {
		for _, piece := range []int{1, 3, 64, len(c.msg)} {
			var s idScanner
			for i := 0; i < len(c.msg); i += piece {
				s.Write([]byte(c.msg[i:min(i+piece, len(c.msg))]))
			}
			id, ok := s.ID()
			switch {
			case c.id == nil && ok:
				t.Errorf("%s (pieces of %d): found id %v, want none", c.name, piece, id.Raw())
			case c.id != nil && (!ok || id.Raw() != c.id):
				t.Errorf("%s (pieces of %d): id %v (%v), want %v", c.name, piece, id.Raw(), ok, c.id)
			}
			if s.hasMethod != c.method {
				t.Errorf("%s: hasMethod %v", c.name, s.hasMethod)
			}
		}
	}
}

// FuzzIDScanner: on any message json.Unmarshal accepts as an object with a scalar id, the scan
// finds that id (and it never panics on anything).
func FuzzIDScanner(f *testing.F) {
	f.Add([]byte(`{"id":1,"result":{"id":2}}`))
	f.Add([]byte(`{"result":"\\\"}","id":"x"}`))
	f.Add([]byte(`{"a":[1,{"b":"]"}],"id":-3.0}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s idScanner
		for i := 0; i < len(b); i += 7 {
			s.Write(b[i:min(i+7, len(b))])
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(b, &m) != nil || m["id"] == nil || bytes.ContainsRune(b, '\\') {
			return // escapes in keys may spell "id" in ways the scan does not read
		}
		var v any
		if json.Unmarshal(m["id"], &v) != nil {
			return
		}
		want, err := jsonrpc.MakeID(v)
		if err != nil || !want.IsValid() || len(m["id"]) > maxIDBytes {
			return
		}
		if got, ok := s.ID(); !ok || got != want {
			t.Errorf("%s: id %v %v, want %v", b, got.Raw(), ok, want.Raw())
		}
	})
}

// TestReadLine: lines up to the limit come back whole; a longer one is not kept, and its size
// and id are known; the reader's buffer size and short reads do not matter.
func TestReadLine(t *testing.T) {
	long := `{"jsonrpc":"2.0","result":{"text":"` + strings.Repeat("z", 5000) + `"},"id":11}`
	in := "{\"a\":1}\r\n" + long + "\nlast"
	br := bufio.NewReaderSize(iotest.HalfReader(strings.NewReader(in)), 16)
	const limit = 1000
	line, over, err := readLine(br, limit)
	if string(line) != `{"a":1}` || over != nil || err != nil {
		t.Fatalf("first line %q %v %v", line, over, err)
	}
	line, over, err = readLine(br, limit)
	if line != nil || over == nil || err != nil || over.size != int64(len(long)+1) {
		t.Fatalf("long line %q %+v %v", line, over, err)
	}
	if id, ok := over.scan.ID(); !ok || id.Raw() != int64(11) {
		t.Errorf("long line's id %v %v", id.Raw(), ok)
	}
	line, over, err = readLine(br, limit)
	if string(line) != "last" || over != nil || err == nil {
		t.Errorf("last line %q %v %v, want it with io.EOF", line, over, err)
	}
}

// TestSSEBody: events within the limit pass byte for byte; an event over it is replaced by an
// error answer to the id its data holds (found across data lines and chunk boundaries); one
// without an id is dropped; the stream goes on after both.
func TestSSEBody(t *testing.T) {
	const limit = 200 << 10
	big := strings.Repeat("w", limit)
	small := "event: message\nid: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n"
	in := small +
		"data: {\"jsonrpc\":\"2.0\",\"result\":{\"t\":\"" + big + "\"},\n" + "data: \"id\":5}\n\n" +
		"data: {\"jsonrpc\":\"2.0\",\"result\":\"" + big + "\"}\n\n" +
		small
	var hits int
	tr := &bodyLimitTransport{name: "u", limit: limit, warn: func(string, ...any) {}, hit: func(string) { hits++ }}
	b := &sseBody{t: tr, body: io.NopCloser(nil), br: bufio.NewReaderSize(iotest.OneByteReader(strings.NewReader(in)), 16), lineStart: true}
	out, err := io.ReadAll(b)
	if err != nil {
		t.Fatal(err)
	}
	want := small + "event: message\ndata: " +
		`{"jsonrpc":"2.0","id":5,"error":{"code":-32603,"message":"upstream u answered with a message of ` +
		fmt.Sprint(len(big)+len("data: {\"jsonrpc\":\"2.0\",\"result\":{\"t\":\"\"},\n")+len("data: \"id\":5}\n")) +
		` bytes, over limits.message_bytes (204800 bytes); the answer was discarded"}}` + "\n\n" + small
	if string(out) != want {
		t.Errorf("got\n%.600q\nwant\n%.600q", out, want)
	}
	if hits != 2 {
		t.Errorf("%d limit hits, want 2", hits)
	}
}
