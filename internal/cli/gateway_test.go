package cli

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// TestGatewayCommandStdio runs `reversi gateway --config ... --manifests ... --store sqlite
// --run-id ...` with its stdio connected to a go-sdk client, against server-memory.
func TestGatewayCommandStdio(t *testing.T) {
	dir := t.TempDir()
	node, args, _ := upstreams.Memory(t)
	cfg := "mode: enforce\nactor: ci-bot\nupstreams:\n  - name: mem\n    command: " + node +
		"\n    args: [" + args[0] + "]\n    env: { MEMORY_FILE_PATH: " + filepath.Join(dir, "graph.jsonl") + " }\n"
	man := "- tool: mem.read_graph\n  description: Read the graph.\n  effect: read_only\n  permission: mem:read\n"
	for name, body := range map[string]string{"gateway.yaml": cfg, "m.yaml": man} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(dir, "data")
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	var stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		root := NewRoot()
		root.SetArgs([]string{"gateway", "--config", filepath.Join(dir, "gateway.yaml"), "--manifests", filepath.Join(dir, "m.yaml"),
			"--store", "sqlite", "--data", data, "--run-id", "run-cli"})
		root.SetIn(inR)
		root.SetOut(outW)
		root.SetErr(&stderr)
		err := root.Execute()
		_ = outW.Close()
		done <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "cli-test", Version: "1"}, nil).Connect(ctx,
		&mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mem.read_graph", Arguments: map[string]any{}})
	if err != nil || res.IsError {
		t.Fatalf("read_graph: %v %+v", err, res)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "mem.create_entities", Arguments: map[string]any{"entities": []any{}}})
	if err != nil || !res.IsError {
		t.Fatalf("create_entities (no manifest, enforce): %v %+v", err, res)
	}
	_ = cs.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("gateway: %v\n%s", err, stderr.String())
		}
	case <-ctx.Done():
		t.Fatal("the gateway did not stop when its stdin closed")
	}
	if !strings.Contains(stderr.String(), "Reversi gateway running in enforce mode.") || !strings.Contains(stderr.String(), "OK mem.read_graph") {
		t.Errorf("stderr:\n%s", stderr.String())
	}
	st, err := store.OpenSQLite(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	run, err := st.GetRun(context.Background(), "run-cli")
	if err != nil || run.Actor != "ci-bot" {
		t.Fatalf("run %+v %v", run, err)
	}
	recs, err := st.Records(context.Background(), "run-cli", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		got = append(got, string(r.Kind)+" "+r.Tool+" "+r.Decision+string(r.Status))
	}
	want := []string{"intent mem.read_graph allow", "outcome mem.read_graph succeeded",
		"intent mem.create_entities block", "outcome mem.create_entities blocked"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("ledger %q, want %q", got, want)
	}
}

func TestGatewayCommandFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"gateway"}, "no upstream"},
		{[]string{"gateway", "--upstream-cmd", "x", "--upstream-url", "http://127.0.0.1:1/mcp"}, "not both"},
		{[]string{"gateway", "--upstream-cmd", "x", "--mode", "loud"}, "--mode"},
		{[]string{"gateway", "--upstream-cmd", "x", "--store", "paper", "--manifests", "../../test/fixtures/manifests"}, "--store"},
		// Flags that would be ignored are errors, and so is a rendering nobody can verify.
		{[]string{"gateway", "--upstream-cmd", "x", "--kube-trusted-keys", "keys"}, "is for --kube-configmap"},
		{[]string{"gateway", "--upstream-cmd", "x", "--kube-controller-keys", "k.pem"}, "is for --kube-configmap and the Kubernetes approval queue"},
		{[]string{"gateway", "--upstream-cmd", "x", "--store", "memory", "--kubeconfig", "nowhere", "--namespace", "ns"}, "the Kubernetes approval queue (--kubeconfig/--namespace) needs the controller's public keys (--kube-controller-keys"},
		{[]string{"gateway", "--upstream-cmd", "x", "--kube-configmap", "ns/cm", "--manifests", "m"}, "give one"},
		{[]string{"gateway", "--upstream-cmd", "x", "--kube-configmap", "ns/cm"}, "--kube-configmap needs the controller's public keys"},
	} {
		var out, errb bytes.Buffer
		if code := Execute(tc.args, &out, &errb); code != 1 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", tc.args, code, errb.String(), tc.want)
		}
	}
}
