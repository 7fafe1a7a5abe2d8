package runs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/controllers"
	"github.com/reversi-gitops/reversi/gateway/notify"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/webhook"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// TestGatewayCommandAlertsCarryItsNamespace: `reversi gateway --kubeconfig --namespace` (the
// built binary) writes its alerts with its namespace, so that a receiver whose namespaces
// filter lists it gets the refused reload of a broken manifest file swapped in while it runs
// (alert.reload_refused, about the ReversiGateway in that namespace, signed), and a receiver
// filtered to another namespace gets nothing. Source: issue 24.
func TestGatewayCommandAlertsCarryItsNamespace(t *testing.T) {
	ns := setupNamespace(t, "alerts")
	f := newFixture(t, ns)
	dir := t.TempDir()
	bin := filepath.Join(dir, "reversi")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/reversi-gitops/reversi").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	type got struct {
		h    http.Header
		body []byte
	}
	mine, other := make(chan got, 8), make(chan got, 8)
	rcv := func(ch chan got) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			ch <- got{r.Header.Clone(), b}
		}))
		t.Cleanup(s.Close)
		return s.URL
	}
	mpath := filepath.Join(dir, "m.yaml")
	if err := os.WriteFile(mpath, []byte(upstreams.MemoryRollbackManifests), 0o600); err != nil {
		t.Fatal(err)
	}
	node, args, _ := upstreams.MemoryAt(t, f.graph)
	cfg := fmt.Sprintf("mode: enforce\nactor: %s\nupstreams:\n  - name: mem\n    command: %q\n    args: [%q]\n    env: { MEMORY_FILE_PATH: %q }\n"+
		"notifications:\n  - {type: webhook, name: mine, url: %q, secret: k, namespaces: [%s], events: [alert.reload_refused]}\n"+
		"  - {type: webhook, name: other, url: %q, namespaces: [elsewhere]}\n", actor, node, args[0], f.graph, rcv(mine), ns, rcv(other))
	cpath := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(cpath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "gateway", "--config", cpath, "--manifests", mpath, "--data", f.data, "--kubeconfig", kubeconfigOf(t, actor),
		"--namespace", ns, "--gateway-name", "gw-alerts")
	cmd.Dir, cmd.Env = dir, append(os.Environ(), controllers.ControllerKeysEnv+"="+string(ctlKey.PublicPEM))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("starting reversi gateway: %v\n%s", err, stderr.String())
	}
	defer cs.Close()
	// The broken file is written again (another size) until its refusal arrives: the file
	// watch (every 2 s) may take its first look after the first write.
	var d got
	for i := 0; d.body == nil; i++ {
		if i == 5 {
			t.Fatalf("no alert.reload_refused within 15 s\n%s", stderr.String())
		}
		broken := fmt.Sprintf("- tool: mem.read_graph\n  effect: maybe%s\n", strings.Repeat("e", i))
		if err := os.WriteFile(mpath, []byte(broken), 0o600); err != nil {
			t.Fatal(err)
		}
		select {
		case d = <-mine:
		case <-time.After(3 * time.Second):
		}
	}
	var b notify.AlertBody
	if err := json.Unmarshal(d.body, &b); err != nil {
		t.Fatal(err)
	}
	if !webhook.Verify("k", d.body, d.h.Get(notify.HeaderSignature)) || b.Type != store.NoticeAlertReloadRefused ||
		b.Object != (store.ObjectRef{Kind: "ReversiGateway", Namespace: ns, Name: "gw-alerts"}) ||
		b.IdempotencyKey != fmt.Sprintf("alert.reload_refused:%s/gw-alerts:%d", ns, b.JournalSeq) {
		t.Fatalf("delivery %v %s", d.h, d.body)
	}
	select {
	case o := <-other:
		t.Fatalf("the receiver of another namespace got %s", o.body)
	case <-time.After(300 * time.Millisecond):
	}
}
