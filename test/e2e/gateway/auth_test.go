package gateway

import (
	"context"
	"errors"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/test/upstreams"
)

// Issue 7 with the real binary: start refusals, `reversi gateway keys add`, and a gateway
// listening beyond loopback with an API key file.

// runToExit runs bin in dir and returns its exit error and stderr.
func runToExit(t *testing.T, dir, bin string, args ...string) (error, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir, cmd.Env = dir, env()
	errw := &syncBuffer{}
	cmd.Stderr = errw
	err := cmd.Run()
	return err, errw.String()
}

func TestStartRefusals(t *testing.T) {
	node, args, uenv := upstreams.Memory(t)
	up := "upstreams:\n" + upstreamYAML("mem", node, args, uenv)
	dir := t.TempDir()
	for _, tc := range []struct {
		name, config, project, want string
	}{
		{"0.0.0.0 without auth", up + "listen: { host: 0.0.0.0, port: 7431 }\n", "",
			`listen.host: "0.0.0.0" is not loopback: the gateway refuses to listen beyond loopback without authentication (set auth.keys or auth.oidc)`},
		{"egress block_private", "upstreams:\n  - name: remote\n    url: http://127.0.0.1:9/mcp\n", "egress: { block_private: true }\n",
			"upstream remote: 127.0.0.1 is a private address and egress.block_private is set in reversi.config.yaml"},
		{"cloud metadata", "upstreams:\n  - name: imds\n    url: http://169.254.169.254/latest\n", "",
			"upstream imds: 169.254.169.254 is a cloud metadata address, which is always refused"},
		{"beyond loopback, no allowed hosts", up + "listen: { host: 0.0.0.0, port: 7431 }\nauth: { keys: keys.json }\n", "",
			`listen.host "0.0.0.0" is not loopback: set allowed_hosts (or resource_url)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			writeFile(t, d, "gateway.yaml", tc.config)
			writeFile(t, d, "keys.json", `{"keys":[]}`)
			if tc.project != "" {
				writeFile(t, d, "reversi.config.yaml", tc.project)
			}
			err, stderr := runToExit(t, d, bins.reversi, "gateway", "--config", "gateway.yaml", "--store", "memory")
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("exit: %v\n%s", err, stderr)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr:\n%s\nwant %q", stderr, tc.want)
			}
		})
	}
}

func TestKeysAddAndAuthenticatedGatewayBeyondLoopback(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys.json")
	add := exec.Command(bins.reversi, "gateway", "keys", "add", "--principal", "ci-bot", "--role", "agent", "-f", keys)
	add.Env = env()
	out, err := add.Output()
	secret := strings.TrimSpace(string(out))
	if err != nil || !strings.HasPrefix(secret, "rvk_") || strings.Count(secret, "\n") != 0 {
		t.Fatalf("keys add: %v %q", err, out)
	}
	node, args, uenv := upstreams.Memory(t)
	port := freePort(t)
	cfg := "actor: nobody\nupstreams:\n" + upstreamYAML("mem", node, args, uenv) +
		"listen: { host: 0.0.0.0, port: " + strconv.Itoa(port) + " }\n" +
		"auth: { keys: " + keys + " }\nallowed_hosts: [127.0.0.1]\n"
	gw := writeFile(t, dir, "gateway.yaml", cfg)
	url, _ := startHTTP(t, bins.reversi, "gateway", "--config", gw, "--store", "sqlite", "--data", filepath.Join(dir, "data"))
	url = strings.NewReplacer("0.0.0.0", "127.0.0.1", "[::]", "127.0.0.1").Replace(url)

	// Without the key: 401 pointing at the metadata.
	res, err := http.Post(url, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != 401 || !strings.Contains(res.Header.Get("WWW-Authenticate"), `resource_metadata="http://127.0.0.1:`+strconv.Itoa(port)+`/.well-known/oauth-protected-resource"`) {
		t.Errorf("no key: %d %q", res.StatusCode, res.Header.Get("WWW-Authenticate"))
	}
	// With it: the run's actor is the key's principal, not the config's actor.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	hc := &http.Client{Transport: bearer{secret}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "reversi.list_runs", Arguments: map[string]any{}})
	if err != nil || r.IsError {
		t.Fatalf("list_runs: %v %+v", err, r)
	}
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mem.read_graph", Arguments: map[string]any{}}); err != nil {
		t.Fatal(err)
	}
	_ = cs.Close()
	st := openLedger(t, filepath.Join(dir, "data"))
	recs := records(t, st)
	if len(recs) == 0 {
		t.Fatal("nothing journaled")
	}
	run, err := st.GetRun(ctx, recs[0].Run)
	if err != nil || run.Actor != "ci-bot" {
		t.Errorf("run actor: %+v %v", run, err)
	}
}

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}
