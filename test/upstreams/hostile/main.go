// Command hostile is an MCP server that misbehaves on purpose, for tests of what the gateway
// does when an upstream nobody here wrote is hostile or broken (issue 18). It speaks raw
// JSON-RPC (no SDK, so that it can break the protocol) over stdio, or over a minimal
// Streamable HTTP endpoint with -http.
//
// Listing (tools/list), chosen with -list and changed at run time by the relist tool:
//
//	normal    the fixed tools below plus -tools generated ones (t0001…), -page per page
//	cycle     every page names one new tool; the cursors go a, b, a, b, … for ever
//	endless   a new cursor on every page, for ever; each page holds -page tools (default 1),
//	          each with a description of -pad bytes
//	many      2,500 generated tools, 100 per page
//	hang      tools/list is never answered
//	described the normal listing and described, a tool with every field a tool can carry:
//	          title, icons, annotations, outputSchema, execution, _meta, and x-later, which no
//	          protocol version defines (for tests of what a gateway passes through); its input
//	          schema has a property of two types, which inspector --strict warns about
//
// Tools (in every listing that has the fixed tools):
//
//	echo {text}            answers the text
//	slow {ms}              answers "slow" after ms milliseconds
//	noise {}               writes a line that is not JSON, then answers "ok"
//	big {bytes, id_last}   answers a text result of bytes bytes (default 20 MiB), the
//	                       response's "id" after its result when id_last is true
//	big_noid {bytes}       writes a message of bytes bytes that has no id, and never answers
//	hang {}                never answers (see -cancel-log)
//	crash {}               exits with status 3 without answering (with -orphan, first starts
//	                       a child that keeps stdout open for 30 s)
//	relist {list}          switches the listing to list, sends
//	                       notifications/tools/list_changed, then answers "relisted"
//	flood {n, method, deaf, notify} sends n requests of method (default ping) to the client,
//	                       ids "flood-1"… (notifications with notify), then answers "flooded";
//	                       with deaf it first stops reading
//	                       stdin for good (HTTP: the client's answers are never taken; the
//	                       requests go on the call's stream with -sse, nowhere without)
//	big_error {bytes}      answers a JSON-RPC error whose message has bytes bytes (default 20 MiB)
//	http_error {status}    HTTP: answers the call's POST with status and a text/plain body
//	bad_answer {line}      answers with text that is not JSON (-sse: as an event's data; with
//	                       line, the event also has a line without a colon)
//	answers {}             answers how many of the flood's requests the client answered
//	lists {}               answers how many tools/list requests (pages) it received
//
// With -verbatim the listings that have the fixed tools also list verbatim {result}, whose
// output schema requires a number n: it answers with result, a string, written as the
// response's result byte for byte (so that tests can send results a JSON encoder never
// writes: case-variant or repeated keys, a carriage return between tokens).
//
// Other faults: -stderr writes its text on stderr before anything else, -stderr-lines times
// (escapes \n, \r and \x1b in it are decoded); -banner writes a line before reading anything; -garbage writes a line that is
// not JSON before every message. -cancel-log appends the requestId of every
// notifications/cancelled received, one per line; -calls-log the name of every tools/call.
//
// With -http ADDR (127.0.0.1:0 picks a port) it serves POST on /mcp, answering calls with
// application/json (tools/call and tools/list with text/event-stream under -sse), prints
// "listening on http://ADDR/mcp" on stderr and runs until killed. GET is 405 (no standalone
// stream).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// deaf is closed when the server stops taking the client's messages (the flood tool's deaf);
// answered counts the client's answers to the flood's requests.
var (
	deaf     = make(chan struct{})
	deafOnce sync.Once
	answered atomic.Int64
	listed   atomic.Int64 // tools/list requests received
)

var (
	listFlag  = flag.String("list", "normal", "listing: normal, cycle, endless, many, hang, described or badheader")
	toolsFlag = flag.Int("tools", 0, "normal listing: generated tools besides the fixed ones")
	pageFlag  = flag.Int("page", 0, "tools per tools/list page (normal: 0 is one page; endless: 0 is 1)")
	padFlag   = flag.Int("pad", 0, "endless listing: bytes of description per tool")
	banner    = flag.String("banner", "", "a line written on stdout before reading anything")
	stderrOut = flag.String("stderr", "", `text written on stderr at start (\n, \r and \x1b decoded)`)
	stderrN   = flag.Int("stderr-lines", 1, "how many times -stderr is written")
	garbage   = flag.Bool("garbage", false, "write a line that is not JSON before every message")
	cancelLog = flag.String("cancel-log", "", "append the requestId of every notifications/cancelled to this file")
	callsLog  = flag.String("calls-log", "", "append the name of every tools/call to this file")
	httpAddr  = flag.String("http", "", "serve Streamable HTTP on this address instead of stdio")
	sse       = flag.Bool("sse", false, "HTTP: answer tools/call and tools/list as text/event-stream")
	orphan    = flag.Bool("orphan", false, "crash: leave a child holding stdout open")
	sleep     = flag.Duration("sleep", 0, "sleep this long and exit (the -orphan child)")
	verbatim  = flag.Bool("verbatim", false, "also list the verbatim tool (see the package comment)")
)

func main() {
	flag.Parse()
	if *sleep > 0 {
		time.Sleep(*sleep)
		return
	}
	if *stderrOut != "" {
		text := strings.NewReplacer(`\n`, "\n", `\r`, "\r", `\x1b`, "\x1b").Replace(*stderrOut)
		w := bufio.NewWriterSize(os.Stderr, 64<<10)
		for range *stderrN {
			w.WriteString(text)
		}
		w.Flush()
	}
	s := &server{list: *listFlag}
	if *httpAddr != "" {
		if err := s.serveHTTP(*httpAddr); err != nil {
			fmt.Fprintln(os.Stderr, "hostile:", err)
			os.Exit(1)
		}
		return
	}
	s.out = bufio.NewWriterSize(os.Stdout, 64<<10)
	if *banner != "" {
		s.writeLine([]byte(*banner))
	}
	in := bufio.NewReaderSize(os.Stdin, 64<<10)
	for {
		select {
		case <-deaf:
			select {} // never reads again
		default:
		}
		line, err := in.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			s.handle(context.Background(), line, s.writeMessage)
		}
		if err != nil {
			os.Exit(0) // stdin closed: the client is done
		}
	}
}

// streamKey carries, in an HTTP call's context with -sse, the function that writes one event
// on the call's stream.
type streamKey struct{}

type server struct {
	mu   sync.Mutex // guards out and list
	out  *bufio.Writer
	list string
	// notify sends a server notification (stdio: on stdout; HTTP: dropped, no stream).
	notify func(method string)
}

type request struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

// writeLine writes one line on stdout, after a garbage line with -garbage.
func (s *server) writeLine(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if *garbage {
		s.out.WriteString("this line is not JSON {\"id\": 1}\n")
	}
	s.out.Write(b)
	s.out.WriteByte('\n')
	s.out.Flush()
}

func (s *server) writeMessage(b []byte) { s.writeLine(b) }

func appendLine(file, line string) {
	if file == "" {
		return
	}
	f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostile:", err)
		return
	}
	defer f.Close()
	fmt.Fprintln(f, line)
}

func result(id json.RawMessage, v any) []byte {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "result": v})
	return b
}

func rpcError(id json.RawMessage, code int, msg string) []byte {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": code, "message": msg}})
	return b
}

func text(s string) map[string]any {
	return map[string]any{"content": []any{map[string]any{"type": "text", "text": s}}}
}

// handle answers one message with write (which may be called later, or never).
func (s *server) handle(ctx context.Context, line []byte, write func([]byte)) {
	var req request
	if err := json.Unmarshal(line, &req); err != nil {
		return
	}
	call := len(req.ID) > 0 && string(req.ID) != "null"
	switch req.Method {
	case "initialize":
		var p struct {
			ProtocolVersion string `json:"protocolVersion"`
		}
		_ = json.Unmarshal(req.Params, &p)
		if p.ProtocolVersion == "" {
			p.ProtocolVersion = "2025-06-18"
		}
		write(result(req.ID, map[string]any{"protocolVersion": p.ProtocolVersion,
			"capabilities": map[string]any{"tools": map[string]any{"listChanged": true}},
			"serverInfo":   map[string]any{"name": "hostile", "version": "1.0.0"}}))
	case "ping":
		write(result(req.ID, map[string]any{}))
	case "tools/list":
		listed.Add(1)
		var p struct {
			Cursor string `json:"cursor"`
		}
		_ = json.Unmarshal(req.Params, &p)
		if page := s.page(p.Cursor); page != nil {
			write(result(req.ID, page))
		}
	case "tools/call":
		// Its own goroutine: a hanging call must not hold the others.
		go s.call(ctx, req, write)
	case "": // an answer to a request of ours
		if bytes.HasPrefix(req.ID, []byte(`"flood-`)) {
			answered.Add(1)
		}
	case "notifications/cancelled":
		var p struct {
			RequestID any `json:"requestId"`
		}
		_ = json.Unmarshal(req.Params, &p)
		appendLine(*cancelLog, fmt.Sprint(p.RequestID))
	default:
		if call {
			write(rpcError(req.ID, -32601, "method not found: "+req.Method))
		}
	}
}

func tool(name, desc string, props map[string]any) map[string]any {
	if props == nil {
		props = map[string]any{}
	}
	return map[string]any{"name": name, "description": desc, "inputSchema": map[string]any{"type": "object", "properties": props}}
}

func fixedTools() []any {
	str := map[string]any{"type": "string"}
	num := map[string]any{"type": "number"}
	tools := []any{
		tool("echo", "Answers its text.", map[string]any{"text": str}),
		tool("slow", "Answers after ms milliseconds.", map[string]any{"ms": num}),
		tool("noise", "Writes a line that is not JSON, then answers.", nil),
		tool("big", "Answers a large text result.", map[string]any{"bytes": num, "id_last": map[string]any{"type": "boolean"}}),
		tool("big_noid", "Writes a large message without an id and never answers.", map[string]any{"bytes": num}),
		tool("hang", "Never answers.", nil),
		tool("crash", "Exits without answering.", nil),
		tool("relist", "Changes the listing and says so.", map[string]any{"list": str}),
		tool("flood", "Sends n requests to the client, then answers.", map[string]any{"n": num, "method": str, "deaf": map[string]any{"type": "boolean"}, "notify": map[string]any{"type": "boolean"}}),
		tool("http_error", "HTTP: answers the POST with the status and a body that is not JSON.", map[string]any{"status": num}),
		tool("big_error", "Answers a JSON-RPC error whose message has bytes bytes.", map[string]any{"bytes": num}),
		tool("bad_answer", "Answers with something that is not a JSON-RPC message.", map[string]any{"line": map[string]any{"type": "boolean"}}),
		tool("answers", "Answers how many of the flood's requests the client answered.", nil),
		tool("lists", "Answers how many tools/list requests (pages) it received.", nil),
	}
	if *verbatim {
		v := tool("verbatim", "Answers its result string as the result, byte for byte.", map[string]any{"result": str})
		v["outputSchema"] = map[string]any{"type": "object", "properties": map[string]any{"n": num}, "required": []any{"n"}}
		tools = append(tools, v)
	}
	return tools
}

// describedTool is the described listing's extra tool (see the package comment). Its JSON is
// written as a literal so that tests can compare it byte for byte after decoding.
func describedTool() json.RawMessage {
	return json.RawMessage(`{"name":"described","title":"Described tool",` +
		`"description":"Carries every tool field.",` +
		`"inputSchema":{"type":"object","properties":{"q":{"type":["string","null"]}}},` +
		`"outputSchema":{"type":"object","properties":{"n":{"type":"number"}},"required":["n"]},` +
		`"annotations":{"title":"Described","readOnlyHint":true,"openWorldHint":false},` +
		`"icons":[{"src":"https://icons.test/d.png","mimeType":"image/png","sizes":["48x48"],"theme":"dark"}],` +
		`"execution":{"taskSupport":"optional"},` +
		`"_meta":{"hostile/note":"kept"},` +
		`"x-later":{"field":"a later protocol version might add"}}`)
}

// page is the tools/list result for cursor under the current listing.
func (s *server) page(cursor string) map[string]any {
	s.mu.Lock()
	mode := s.list
	s.mu.Unlock()
	switch mode {
	case "cycle":
		next := map[string]string{"": "a", "a": "b", "b": "a"}[cursor]
		return map[string]any{"tools": []any{tool("cycle_"+cursor, "", nil)}, "nextCursor": next}
	case "endless":
		n, _ := strconv.Atoi(strings.TrimPrefix(cursor, "c"))
		per := max(*pageFlag, 1)
		pad := strings.Repeat("x", *padFlag)
		tools := make([]any, per)
		for i := range tools {
			tools[i] = tool(fmt.Sprintf("endless_%d_%d", n, i), pad, nil)
		}
		return map[string]any{"tools": tools, "nextCursor": fmt.Sprintf("c%d", n+1)}
	case "many":
		return generated(cursor, 2500, 100)
	case "hang":
		return nil
	case "badheader":
		// An x-mcp-header on an object property: go-sdk's Server.AddTool panics on it.
		p := generated(cursor, *toolsFlag, *pageFlag)
		p["tools"] = append(p["tools"].([]any), json.RawMessage(`{"name":"badheader","inputSchema":{"type":"object",`+
			`"properties":{"o":{"type":"object","x-mcp-header":"X-O"}}}}`))
		return p
	case "described":
		p := generated(cursor, *toolsFlag, *pageFlag)
		if _, more := p["nextCursor"]; !more {
			p["tools"] = append(p["tools"].([]any), describedTool())
		}
		return p

	default:
		return generated(cursor, *toolsFlag, *pageFlag)
	}
}

// generated pages the fixed tools and n generated ones, per to a page (0: all).
func generated(cursor string, n, per int) map[string]any {
	all := fixedTools()
	for i := 1; i <= n; i++ {
		all = append(all, tool(fmt.Sprintf("t%04d", i), "A generated tool.", nil))
	}
	start, _ := strconv.Atoi(strings.TrimPrefix(cursor, "p"))
	if per <= 0 {
		per = len(all)
	}
	end := min(start+per, len(all))
	out := map[string]any{"tools": all[start:end]}
	if end < len(all) {
		out["nextCursor"] = fmt.Sprintf("p%d", end)
	}
	return out
}

func (s *server) call(ctx context.Context, req request, write func([]byte)) {
	var p struct {
		Name      string `json:"name"`
		Arguments struct {
			Text   string  `json:"text"`
			Ms     float64 `json:"ms"`
			Bytes  float64 `json:"bytes"`
			IDLast bool    `json:"id_last"`
			List   string  `json:"list"`
			N      float64 `json:"n"`
			Method string  `json:"method"`
			Deaf   bool    `json:"deaf"`
			Notify bool    `json:"notify"`
			Line   bool    `json:"line"`
			Result string  `json:"result"`
		} `json:"arguments"`
	}
	_ = json.Unmarshal(req.Params, &p)
	appendLine(*callsLog, p.Name)
	a := p.Arguments
	size := int(a.Bytes)
	if size <= 0 {
		size = 20 << 20
	}
	switch p.Name {
	case "echo":
		write(result(req.ID, text(a.Text)))
	case "slow":
		select {
		case <-time.After(time.Duration(a.Ms) * time.Millisecond):
			write(result(req.ID, text("slow")))
		case <-ctx.Done():
		}
	case "noise":
		s.mu.Lock()
		if s.out != nil {
			s.out.WriteString("noise: \x1b[31mnot JSON\x1b[0m\n")
		}
		s.mu.Unlock()
		write(result(req.ID, text("ok")))
	case "big":
		body, _ := json.Marshal(text(strings.Repeat("y", size)))
		var b bytes.Buffer
		if a.IDLast {
			fmt.Fprintf(&b, `{"jsonrpc":"2.0","result":%s,"id":%s}`, body, req.ID)
		} else {
			fmt.Fprintf(&b, `{"jsonrpc":"2.0","id":%s,"result":%s}`, req.ID, body)
		}
		write(b.Bytes())
	case "big_noid":
		body, _ := json.Marshal(text(strings.Repeat("z", size)))
		write([]byte(fmt.Sprintf(`{"jsonrpc":"2.0","result":%s}`, body)))
	case "hang":
		<-ctx.Done() // stdio: never; HTTP: until the client goes away
	case "crash":
		if *orphan {
			child := exec.Command(os.Args[0], "-sleep", "30s")
			child.Stdout = os.Stdout
			_ = child.Start()
		}
		os.Exit(3)
	case "relist":
		s.mu.Lock()
		s.list = a.List
		s.mu.Unlock()
		if s.notify != nil {
			s.notify("notifications/tools/list_changed")
		} else {
			s.writeLine([]byte(`{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`))
		}
		write(result(req.ID, text("relisted")))
	case "big_error":
		write(rpcError(req.ID, -32603, strings.Repeat("E", size)))
	case "bad_answer":
		// Not a JSON-RPC message: over stdio a line that is not JSON, over HTTP a JSON body (or
		// an SSE event, whose data lines then include one without a colon with line) that is
		// not JSON.
		bad := "this answer is not JSON"
		if a.Line {
			bad += "\nthis line has no colon"
		}
		write([]byte(bad))
	case "verbatim":
		write([]byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":%s}`, req.ID, a.Result)))
	case "answers":
		write(result(req.ID, text(strconv.FormatInt(answered.Load(), 10))))
	case "lists":
		write(result(req.ID, text(strconv.FormatInt(listed.Load(), 10))))
	case "flood":
		if a.Deaf {
			deafOnce.Do(func() { close(deaf) })
		}
		method := a.Method
		if method == "" {
			method = "ping"
		}
		for i := 1; i <= int(a.N); i++ {
			m := map[string]any{"jsonrpc": "2.0", "id": fmt.Sprintf("flood-%d", i), "method": method, "params": map[string]any{}}
			if a.Notify {
				delete(m, "id")
			}
			b, _ := json.Marshal(m)
			if stream, ok := ctx.Value(streamKey{}).(func([]byte)); ok {
				stream(b) // HTTP -sse: on the call's own stream
			} else if s.notify == nil {
				s.writeLine(b)
			}
		}
		write(result(req.ID, text("flooded")))
	default:
		write(result(req.ID, map[string]any{"isError": true, "content": []any{map[string]any{"type": "text", "text": "unknown tool " + p.Name}}}))
	}
}

// serveHTTP serves POST /mcp: each call is answered on its own request, as JSON or, with
// -sse, as one SSE event.
func (s *server) serveHTTP(addr string) error {
	s.notify = func(string) {} // no standalone stream to send it on
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "listening on http://%s/mcp\n", ln.Addr())
	mux := http.NewServeMux()
	mux.HandleFunc("/mcp", func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodPost:
		case http.MethodDelete:
			return
		default:
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		var req request
		if json.Unmarshal(body, &req) != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if len(req.ID) == 0 { // a notification
			s.handle(r.Context(), body, func([]byte) {})
			w.WriteHeader(http.StatusAccepted)
			return
		}
		if req.Method == "" { // the client's answer to a request of ours
			select {
			case <-deaf: // deaf: the answer is never taken
				<-r.Context().Done()
				return
			default:
			}
			s.handle(r.Context(), body, func([]byte) {})
			w.WriteHeader(http.StatusAccepted)
			return
		}
		var status struct {
			Params struct {
				Name      string `json:"name"`
				Arguments struct {
					Status int `json:"status"`
				} `json:"arguments"`
			} `json:"params"`
		}
		if req.Method == "tools/call" && json.Unmarshal(body, &status) == nil && status.Params.Name == "http_error" {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(status.Params.Arguments.Status)
			fmt.Fprintln(w, "<html>an error page, not JSON</html>")
			return
		}
		if *sse && (req.Method == "tools/call" || req.Method == "tools/list") {
			// One event stream per call: the requests the call sends (flood), then its answer.
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			var mu sync.Mutex
			event := func(b []byte) {
				mu.Lock()
				defer mu.Unlock()
				fmt.Fprintf(w, "event: message\ndata: %s\n\n", b)
				w.(http.Flusher).Flush()
			}
			answer := make(chan []byte, 1)
			s.handle(context.WithValue(r.Context(), streamKey{}, event), body, func(b []byte) { answer <- b })
			select {
			case msg := <-answer:
				event(msg)
			case <-r.Context().Done():
			}
			return
		}
		answer := make(chan []byte, 1)
		s.handle(r.Context(), body, func(b []byte) { answer <- b })
		var msg []byte
		select {
		case msg = <-answer:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(msg)
	})
	return (&http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}).Serve(ln)
}
