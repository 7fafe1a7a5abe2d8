package podrun

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// FreePort is a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Bearer is an http.RoundTripper that sends Token as "Authorization: Bearer <Token>" (a
// gateway API key).
type Bearer struct{ Token string }

// RoundTrip adds the header to a copy of r.
func (b Bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.Token)
	return http.DefaultTransport.RoundTrip(r)
}

// ConnectAgent opens an MCP session (go-sdk client, streamable HTTP) at endpoint with the API
// key, as an agent named name.
func ConnectAgent(ctx context.Context, name, endpoint, apiKey string) (*mcp.ClientSession, error) {
	cs, err := mcp.NewClient(&mcp.Implementation{Name: name, Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint: endpoint, HTTPClient: &http.Client{Transport: Bearer{apiKey}}}, nil)
	if err != nil {
		return nil, fmt.Errorf("the agent cannot connect to %s: %w", endpoint, err)
	}
	return cs, nil
}

// CallTool makes one tool call (30 s at most) and returns the text of its content and
// whether it is an error result.
func CallTool(ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any) (string, bool, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return "", false, fmt.Errorf("the call of %s: %w", tool, err)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String(), res.IsError, nil
}
