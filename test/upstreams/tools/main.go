// Command tools is an MCP server over stdio (go-sdk) whose tools are named on its command
// line, for tests of rules about tools the reference servers lack (a refund, an e-mail): each
// tool takes any object of arguments and answers them back as JSON text. With -calls-log it
// appends the name of every call it served, one per line, so a test can tell a call that
// reached it from one the gateway refused.
//
//	tools -calls-log calls.txt refund get_charge
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() {
	callsLog := flag.String("calls-log", "", "append the name of every tools/call served to this file")
	flag.Parse()
	if flag.NArg() == 0 {
		log.Fatal("tools: name at least one tool")
	}
	var mu sync.Mutex
	s := mcp.NewServer(&mcp.Implementation{Name: "tools", Version: "1"}, nil)
	for _, name := range flag.Args() {
		s.AddTool(&mcp.Tool{Name: name, Description: "answers its arguments", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				if *callsLog != "" {
					mu.Lock()
					f, err := os.OpenFile(*callsLog, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
					if err == nil {
						_, err = fmt.Fprintln(f, name)
						_ = f.Close()
					}
					mu.Unlock()
					if err != nil {
						return nil, err
					}
				}
				args := string(req.Params.Arguments)
				if args == "" {
					args = "{}"
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: args}}}, nil
			})
	}
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		log.Fatal(err)
	}
}
