package gateway

import (
	"bufio"
	"bytes"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// TestStdioGarbageLine (issue 18) with the real binary: a line from the client that is not
// JSON-RPC is answered with a parse error (-32700, id null) and the gateway goes on: the next
// call works, the gateway exits 0 when its stdin closes, and its SQLite journal is intact.
func TestStdioGarbageLine(t *testing.T) {
	node, args, _ := upstreams.Everything(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	cmd, errw := command(t, bins.gateway, "--data", data, "--upstream-cmd", node, "--upstream-arg", args[0], "--upstream-arg", args[1])
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := make(chan []byte, 8)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- append([]byte(nil), sc.Bytes()...)
		}
		close(lines)
	}()
	send := func(s string) {
		t.Helper()
		if _, err := io.WriteString(in, s+"\n"); err != nil {
			t.Fatalf("write: %v\nstderr:\n%s", err, errw)
		}
	}
	recv := func(want string) {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok || !bytes.Contains(l, []byte(want)) {
				t.Fatalf("got %q (open %v), want %s\nstderr:\n%s", l, ok, want, errw)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no answer within 30 s\nstderr:\n%s", errw)
		}
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"e2e","version":"1"}}}`)
	recv(`"id":1,"result"`)
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	send(`hello, this is not JSON-RPC`)
	recv(`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,`)
	send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"message":"still here"}}}`)
	recv(`still here`)
	_ = in.Close()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit: %v\nstderr:\n%s", err, errw)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the gateway did not exit after its stdin closed")
	}
	if err := store.CheckSQLiteIntegrity(data); err != nil {
		t.Fatal(err)
	}
	st := openLedger(t, data)
	if got := outcomes(records(t, st), "echo"); len(got) != 1 || got[0].Status != store.Succeeded {
		t.Fatalf("echo outcomes: %+v", got)
	}
}
