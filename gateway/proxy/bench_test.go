package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// BenchmarkGatewayCall is one read_graph of the real server-memory (20 entities, 20
// relations), direct over stdio and through the gateway (in-memory transport between the
// go-sdk client and the gateway, SQLite journal in a temp folder, read_graph classified
// read_only so each call journals an intent and an outcome). sessions=16 runs 16 client
// sessions at once over the gateway's one upstream; its ns/op is wall time per call, so
// calls/s is 1e9/ns_op. hack/bench (`go run ./hack/bench gateway`) gives percentiles and the
// stdio and HTTP transports; figures in BENCHMARKS.md.
func BenchmarkGatewayCall(b *testing.B) {
	mem := filepath.Join(b.TempDir(), "memory.jsonl")
	if err := os.WriteFile(mem, benchGraph(), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd, args, env := upstreams.MemoryAt(b, mem)

	b.Run("direct", func(b *testing.B) {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "0"}, nil).
			Connect(context.Background(), &mcp.CommandTransport{Command: upstreams.Command(cmd, args, env)}, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer cs.Close()
		benchCalls(b, []*mcp.ClientSession{cs}, "read_graph")
	})
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprintf("gateway/sessions=%d", n), func(b *testing.B) {
			gw, st := benchGateway(b, cmd, args, env)
			sessions := make([]*mcp.ClientSession, n)
			for i := range sessions {
				sessions[i] = benchClient(b, gw)
			}
			benchCalls(b, sessions, "memory.read_graph")
			b.StopTimer()
			benchJournaled(b, st, n*benchWarmup+b.N)
		})
	}
}

// benchGateway starts a gateway in enforce mode with read_graph classified read_only, in
// front of server-memory, journaling to SQLite.
func benchGateway(b *testing.B, cmd string, args, env []string) (*Gateway, store.Store) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u := config.Upstream{Name: "memory", Command: cmd, Args: args, Env: map[string]string{}, Namespace: true}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		u.Env[k] = v
	}
	cfg := &config.Gateway{Mode: config.ModeEnforce, UnclassifiedReads: config.UnclassifiedBlock,
		ValidateSchemas: true, Actor: "bench", Upstreams: []config.Upstream{u}}
	p := filepath.Join(b.TempDir(), "manifests.yaml")
	const m = "- tool: memory.read_graph\n  description: Read the whole knowledge graph.\n  effect: read_only\n  permission: memory:read\n"
	if err := os.WriteFile(p, []byte(m), 0o600); err != nil {
		b.Fatal(err)
	}
	docs, errs := manifest.ReadPaths(p)
	ms, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		b.Fatalf("manifests: %v", errs)
	}
	st, err := store.OpenSQLite(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	gw, err := New(ctx, Options{Config: cfg, Manifests: ms, Store: st})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = gw.Close() })
	return gw, st
}

func benchClient(b *testing.B, gw *Gateway) *mcp.ClientSession {
	b.Helper()
	ct, stt := mcp.NewInMemoryTransports()
	ss, err := gw.Server().Connect(context.Background(), stt, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "0"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cs.Close() })
	return cs
}

const benchWarmup = 50

// benchCalls warms every session up with benchWarmup calls, then makes b.N calls spread over the
// sessions, each session from its own goroutine.
func benchCalls(b *testing.B, sessions []*mcp.ClientSession, tool string) {
	b.Helper()
	ctx := context.Background()
	call := func(cs *mcp.ClientSession) error {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{}})
		if err == nil && res.IsError {
			err = fmt.Errorf("%s: isError: %v", tool, res.Content)
		}
		return err
	}
	for _, cs := range sessions {
		for range benchWarmup {
			if err := call(cs); err != nil {
				b.Fatal(err)
			}
		}
	}
	var next atomic.Int64
	b.SetParallelism((len(sessions) + 1) / 2) // with GOMAXPROCS 2: one goroutine per session
	cpu0 := processCPU()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		cs := sessions[int(next.Add(1)-1)%len(sessions)]
		for pb.Next() {
			if err := call(cs); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
	// CPU of this process (client and gateway, not the node upstream) per call: on a loaded
	// machine a steadier figure than the wall time.
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/call")
}

// processCPU is the user+system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchJournaled checks that each of the want calls was journaled: one allowed intent and one
// succeeded outcome each.
func benchJournaled(b *testing.B, st store.Store, want int) {
	b.Helper()
	ctx := context.Background()
	runs, err := st.ListRuns(ctx, store.RunFilter{})
	if err != nil {
		b.Fatal(err)
	}
	intents, outcomes := 0, 0
	for _, r := range runs {
		recs, err := st.Records(ctx, r.ID, 0, 0)
		if err != nil {
			b.Fatal(err)
		}
		for _, rec := range recs {
			switch {
			case rec.Kind == store.KindIntent && rec.Decision == "allow":
				intents++
			case rec.Kind == store.KindOutcome && rec.Status == store.Succeeded:
				outcomes++
			}
		}
	}
	if intents != want || outcomes != want {
		b.Fatalf("journal: %d allowed intents, %d succeeded outcomes; want %d of each (one per call)", intents, outcomes, want)
	}
}

// benchGraph is a knowledge graph of 20 entities and 20 relations (server-memory's JSON lines).
func benchGraph() []byte {
	var out []byte
	for i := range 20 {
		e, _ := json.Marshal(map[string]any{"type": "entity", "name": fmt.Sprintf("service-%02d", i), "entityType": "service",
			"observations": []string{fmt.Sprintf("owned by team-%d", i%4), "deployed on cluster-a", fmt.Sprintf("port %d", 8000+i)}})
		r, _ := json.Marshal(map[string]any{"type": "relation", "from": fmt.Sprintf("service-%02d", i),
			"to": fmt.Sprintf("service-%02d", (i+1)%20), "relationType": "calls"})
		out = append(append(append(append(out, e...), '\n'), r...), '\n')
	}
	return out
}
