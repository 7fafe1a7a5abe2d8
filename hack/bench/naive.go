package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// naiveProxyMain is the hidden subcommand `naive-proxy -- server args...`: the proxy anyone
// would write first on github.com/modelcontextprotocol/go-sdk (the version in go.mod). A
// go-sdk client session on the stdio server; a go-sdk server on stdio offering the server's
// tools, each call forwarded to the client session as it came (name, arguments, _meta) and
// its result returned as it came back. No journal, no decision, no schema check: what the
// protocol library alone costs per call.
func naiveProxyMain(argv []string) error {
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return errors.New("naive-proxy: give the server's command line after --")
	}
	ctx := context.Background()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "naive-go-sdk-proxy", Version: "0"}, nil)
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	up, err := client.Connect(cctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 5 * time.Second}, nil)
	cancel()
	if err != nil {
		return fmt.Errorf("naive-proxy: connect to the server: %w", err)
	}
	defer up.Close()
	server := mcp.NewServer(&mcp.Implementation{Name: "naive-go-sdk-proxy", Version: "0"}, nil)
	n := 0
	for t, err := range up.Tools(ctx, nil) {
		if err != nil {
			return fmt.Errorf("naive-proxy: tools/list: %w", err)
		}
		server.AddTool(t, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return up.CallTool(ctx, &mcp.CallToolParams{Meta: req.Params.Meta, Name: req.Params.Name, Arguments: req.Params.Arguments})
		})
		n++
	}
	if n == 0 {
		return errors.New("naive-proxy: the server lists no tools")
	}
	return server.Run(ctx, &mcp.StdioTransport{})
}
