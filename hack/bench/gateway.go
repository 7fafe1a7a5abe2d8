package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/proxy"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/syncbuf"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// benchManifest classifies read_graph (read_only), so every gateway call is decided, allowed
// and journaled (intent, then outcome) in enforce mode.
const benchManifest = `- tool: memory.read_graph
  description: Read the whole knowledge graph.
  effect: read_only
  permission: memory:read
`

const (
	directTool  = "read_graph"
	gatewayTool = "memory.read_graph"
	actor       = "bench"
)

type gatewayFlags struct {
	calls, warmup int
	sessions      []int
	reversi       string
	cpuprofile    string
	keep          bool
	store         string
	// postgres, when set, adds a gateway HTTP row journaling to PostgreSQL: it returns the
	// URL of a new empty database (the suite starts a throwaway server with test/pgtest).
	postgres func(context.Context) (string, error)
}

func gatewayMain(argv []string) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	var f gatewayFlags
	var sessions string
	fs.IntVar(&f.calls, "calls", 4000, "measured calls per row (split evenly over the sessions)")
	fs.IntVar(&f.warmup, "warmup", 200, "unmeasured calls per session before measuring")
	fs.StringVar(&sessions, "sessions", "1,16", "concurrent session counts, comma-separated")
	fs.StringVar(&f.reversi, "reversi", "", "reversi binary for the stdio gateway (default: go build of this module)")
	fs.StringVar(&f.cpuprofile, "cpuprofile", "", "write a CPU profile of the largest gateway HTTP row (the gateway runs in this process) to this file")
	fs.StringVar(&f.store, "store", "sqlite", "gateway store: sqlite (the measured configuration) or memory (to isolate the journal's cost)")
	fs.BoolVar(&f.keep, "keep", false, "keep the temporary folder (journals, memory file, config)")
	if err := fs.Parse(argv); err != nil {
		return err
	}
	for _, s := range strings.Split(sessions, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("-sessions %q: want positive integers, e.g. 1,16", sessions)
		}
		f.sessions = append(f.sessions, n)
	}
	if f.store != "sqlite" && f.store != "memory" {
		return fmt.Errorf("-store %q: use sqlite or memory", f.store)
	}
	if f.calls < 1 || f.warmup < 0 {
		return errors.New("-calls must be positive and -warmup not negative")
	}
	rows, notes, err := runGateway(f)
	if err != nil {
		return err
	}
	printTable(os.Stdout, rows, notes)
	return nil
}

// env is what every row shares: the seeded memory file, the manifest, the config, the binary.
type env struct {
	dir       string
	memCmd    string
	memArgs   []string
	memEnv    []string
	manifests string // manifest file
	cfgFile   string // gateway config (JSON, which config.Load reads as YAML)
	reversi   string
	store     string // sqlite or memory
}

// runGateway measures every row of f and returns them with the table's notes.
func runGateway(f gatewayFlags) ([]row, []string, error) {
	dir, err := os.MkdirTemp("", "reversi-bench-")
	if err != nil {
		return nil, nil, err
	}
	if f.keep {
		fmt.Fprintln(os.Stderr, "bench: keeping", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	e, err := setup(dir, f.reversi)
	if err != nil {
		return nil, nil, err
	}
	e.store = f.store
	ctx := context.Background()
	maxN := 0
	for _, n := range f.sessions {
		maxN = max(maxN, n)
	}

	var rows []row
	var notes []string
	label := map[string]string{"sqlite": "SQLite", "memory": "memory store"}[f.store]
	for _, n := range f.sessions {
		per := max(f.calls/n, 1)
		m := func(name, topology string, sess []*mcp.ClientSession, tool string) (row, error) {
			fmt.Fprintf(os.Stderr, "bench: %s, %d session(s), %d calls each ...\n", name, n, per)
			r, err := measure(ctx, sess, tool, f.warmup, per)
			if err != nil {
				return row{}, fmt.Errorf("%s, %d sessions: %w", name, n, err)
			}
			return row{name: name, topology: topology, sessions: n, res: r}, nil
		}

		// direct stdio: one server-memory process per session, as over stdio a process serves
		// one session.
		d, err := e.directStdio(ctx, n)
		if err != nil {
			return nil, nil, err
		}
		direct, err := m("direct stdio", fmt.Sprintf("%d server-memory process(es), one session each", n), d.sessions, directTool)
		d.close()
		if err != nil {
			return nil, nil, err
		}
		rows = append(rows, direct)
		httpBase := direct

		if n > 1 {
			// The HTTP gateway forwards every session's calls over its ONE upstream session:
			// its baseline is one server-memory process with n concurrent callers.
			d, err := e.directStdio(ctx, 1)
			if err != nil {
				return nil, nil, err
			}
			shared := make([]*mcp.ClientSession, n)
			for i := range shared {
				shared[i] = d.sessions[0]
			}
			sr, err := m("direct stdio, 1 upstream", fmt.Sprintf("1 server-memory process, %d callers on its one session", n), shared, directTool)
			d.close()
			if err != nil {
				return nil, nil, err
			}
			rows = append(rows, sr)
			httpBase = sr
		}

		// gateway stdio: n `reversi gateway` processes (what n agents each spawning the gateway
		// get), each with its own server-memory, all journaling to one SQLite data folder.
		data := filepath.Join(dir, fmt.Sprintf("stdio-%d", n))
		g, err := e.gatewayStdio(ctx, n, data)
		if err != nil {
			return nil, nil, err
		}
		fmt.Fprintf(os.Stderr, "bench: gateway stdio (%s), %d session(s), %d calls each ...\n", label, n, per)
		var cpu0 time.Duration
		sres, err := measureWith(ctx, g.sessions, gatewayTool, f.warmup, per, func() (err error) { cpu0, err = cpuTime(g.pids); return err })
		var cpu time.Duration
		if err == nil {
			var cpu1 time.Duration
			if cpu1, err = cpuTime(g.pids); err == nil {
				cpu = cpu1 - cpu0
			}
		}
		g.close()
		gr := row{name: "gateway stdio (" + label + ")", topology: fmt.Sprintf("%d reversi gateway process(es), each with its own server-memory; one SQLite file", n),
			sessions: n, res: sres, gatewayCPU: cpu}
		if err != nil {
			return nil, nil, err
		}
		if err := e.checkJournal(ctx, data, n*(f.warmup+per)); err != nil {
			return nil, nil, fmt.Errorf("gateway stdio, %d sessions: %w", n, err)
		}
		gr.base = &direct
		rows = append(rows, gr)

		// gateway HTTP: one gateway (in this process, so that it can be profiled), one
		// server-memory, n Streamable HTTP sessions over loopback.
		data = filepath.Join(dir, fmt.Sprintf("http-%d", n))
		h, err := e.gatewayHTTP(ctx, n, data, "")
		if err != nil {
			return nil, nil, err
		}
		var stopProfile func() error
		if f.cpuprofile != "" && n == maxN {
			h.beforeMeasure = func() error {
				pf, err := os.Create(f.cpuprofile)
				if err != nil {
					return err
				}
				if err := pprof.StartCPUProfile(pf); err != nil {
					pf.Close()
					return err
				}
				stopProfile = func() error { pprof.StopCPUProfile(); return pf.Close() }
				return nil
			}
		}
		fmt.Fprintf(os.Stderr, "bench: gateway HTTP ("+label+"), %d session(s), %d calls each ...\n", n, per)
		hres, err := measureWith(ctx, h.sessions, gatewayTool, f.warmup, per, h.beforeMeasure)
		if stopProfile != nil {
			if perr := stopProfile(); perr != nil && err == nil {
				err = perr
			}
		}
		h.close()
		if err != nil {
			return nil, nil, fmt.Errorf("gateway HTTP, %d sessions: %w", n, err)
		}
		if err := e.checkJournal(ctx, data, n*(f.warmup+per)); err != nil {
			return nil, nil, fmt.Errorf("gateway HTTP, %d sessions: %w", n, err)
		}
		rows = append(rows, row{name: "gateway HTTP (" + label + ")", topology: fmt.Sprintf("1 gateway (in the bench process), 1 server-memory, %d HTTP session(s)", n),
			sessions: n, res: hres, base: &httpBase})

		if f.postgres != nil {
			// The same HTTP gateway journaling to PostgreSQL (its own database per row).
			pgURL, err := f.postgres(ctx)
			if err != nil {
				return nil, nil, err
			}
			h, err := e.gatewayHTTP(ctx, n, "", pgURL)
			if err != nil {
				return nil, nil, err
			}
			fmt.Fprintf(os.Stderr, "bench: gateway HTTP (PostgreSQL), %d session(s), %d calls each ...\n", n, per)
			pres, err := measure(ctx, h.sessions, gatewayTool, f.warmup, per)
			h.close()
			if err != nil {
				return nil, nil, fmt.Errorf("gateway HTTP (PostgreSQL), %d sessions: %w", n, err)
			}
			if err := e.checkJournalPostgres(ctx, pgURL, n*(f.warmup+per)); err != nil {
				return nil, nil, fmt.Errorf("gateway HTTP (PostgreSQL), %d sessions: %w", n, err)
			}
			rows = append(rows, row{name: "gateway HTTP (PostgreSQL)", topology: fmt.Sprintf("as gateway HTTP (SQLite), journaling to PostgreSQL (test/pgtest on 127.0.0.1), %d HTTP session(s)", n),
				sessions: n, res: pres, base: &httpBase})
		}
	}
	if f.store != "sqlite" {
		notes = append(notes, "THE GATEWAY ROWS USED THE MEMORY STORE (-store "+f.store+"), NOT SQLITE: not the recorded configuration.")
	}
	notes = append(notes,
		"direct HTTP: not measured: @modelcontextprotocol/server-memory speaks stdio only.",
		fmt.Sprintf("journal: every gateway row's SQLite file was read back: one allowed intent and one succeeded outcome per call (%d warm-up calls per session included).", f.warmup),
		"gateway CPU ms per call: user + system CPU of the gateway processes (not their upstreams) while the row was measured (each process's kernel CPU clock, ns), divided by its calls; the HTTP gateway shares the bench process with its clients, so it has none.",
		"added p50: the row's p50 minus the p50 of the direct row with the same upstream topology (gateway stdio vs direct stdio; gateway HTTP vs direct stdio, 1 upstream).")
	if f.postgres != nil {
		notes = append(notes, "PostgreSQL rows: a throwaway server (test/pgtest, Debian's PostgreSQL, defaults: fsync=on, synchronous_commit=on) on 127.0.0.1, a new database per row, read back the same way.")
	}
	if f.cpuprofile != "" {
		notes = append(notes, fmt.Sprintf("CPU profile of the %d-session gateway HTTP row: %s", maxN, f.cpuprofile))
	}
	return rows, notes, nil
}

// setup writes the seeded memory graph, the manifest and the gateway config, and builds the
// reversi binary unless one is given.
func setup(dir, reversi string) (*env, error) {
	e := &env{dir: dir, reversi: reversi}
	mem := filepath.Join(dir, "memory.jsonl")
	if err := os.WriteFile(mem, seedGraph(), 0o600); err != nil {
		return nil, err
	}
	var err error
	if e.memCmd, e.memArgs, e.memEnv, err = upstreams.MemoryCommand(mem); err != nil {
		return nil, err
	}
	e.manifests = filepath.Join(dir, "manifests.yaml")
	if err := os.WriteFile(e.manifests, []byte(benchManifest), 0o600); err != nil {
		return nil, err
	}
	upEnv := map[string]string{}
	for _, kv := range e.memEnv {
		k, v, _ := strings.Cut(kv, "=")
		upEnv[k] = v
	}
	cfg := map[string]any{
		"mode": "enforce", "unclassified_reads": "block", "validate_schemas": true, "actor": actor,
		"upstreams": []map[string]any{{"name": "memory", "command": e.memCmd, "args": e.memArgs, "env": upEnv}},
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, err
	}
	e.cfgFile = filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(e.cfgFile, b, 0o600); err != nil {
		return nil, err
	}
	if e.reversi == "" { // "-": not needed
		e.reversi = filepath.Join(dir, "reversi")
		fmt.Fprintln(os.Stderr, "bench: go build -o", e.reversi, ".")
		build := exec.Command("go", "build", "-o", e.reversi, ".")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return nil, fmt.Errorf("go build of the reversi binary (run the bench from the module root, or pass -reversi): %w", err)
		}
	}
	return e, nil
}

// seedGraph is a knowledge graph of 20 entities (3 observations each) and 20 relations, so
// read_graph answers a few kilobytes rather than an empty graph.
func seedGraph() []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for i := range 20 {
		_ = enc.Encode(map[string]any{"type": "entity", "name": fmt.Sprintf("service-%02d", i), "entityType": "service",
			"observations": []string{fmt.Sprintf("owned by team-%d", i%4), "deployed on cluster-a", fmt.Sprintf("port %d", 8000+i)}})
	}
	for i := range 20 {
		_ = enc.Encode(map[string]any{"type": "relation", "from": fmt.Sprintf("service-%02d", i),
			"to": fmt.Sprintf("service-%02d", (i+1)%20), "relationType": "calls"})
	}
	return buf.Bytes()
}

// fleet is a set of connected client sessions and how to take them down.
type fleet struct {
	sessions      []*mcp.ClientSession
	pids          []int // the processes the sessions talk to (stdio)
	stderr        []*lockedBuffer
	cleanup       []func()
	beforeMeasure func() error
}

func (f *fleet) close() {
	for _, s := range f.sessions {
		_ = s.Close()
	}
	for i := len(f.cleanup) - 1; i >= 0; i-- {
		f.cleanup[i]()
	}
}

// lockedBuffer is a syncbuf.Buffer (kept as a name for the tests here).
type lockedBuffer = syncbuf.Buffer

func newClient() *mcp.Client {
	return mcp.NewClient(&mcp.Implementation{Name: "reversi-bench", Version: "0"}, nil)
}

// connectCommands starts n copies of a stdio server and connects a client session to each,
// all at once (startup dominates on two cores).
func connectCommands(ctx context.Context, n int, mk func() *exec.Cmd) (*fleet, error) {
	f := &fleet{sessions: make([]*mcp.ClientSession, n), stderr: make([]*lockedBuffer, n), pids: make([]int, n)}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			cmd := mk()
			f.stderr[i] = &lockedBuffer{}
			cmd.Stderr = f.stderr[i]
			cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			cs, err := newClient().Connect(cctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 5 * time.Second}, nil)
			if err != nil {
				errs[i] = fmt.Errorf("start %s: %w\nstderr:\n%s", cmd.Path, err, f.stderr[i])
				return
			}
			f.sessions[i] = cs
			f.pids[i] = cmd.Process.Pid
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		var ok []*mcp.ClientSession
		for _, s := range f.sessions {
			if s != nil {
				ok = append(ok, s)
			}
		}
		f.sessions = ok
		f.close()
		return nil, err
	}
	return f, nil
}

func (e *env) directStdio(ctx context.Context, n int) (*fleet, error) {
	return connectCommands(ctx, n, func() *exec.Cmd { return upstreams.Command(e.memCmd, e.memArgs, e.memEnv) })
}

func (e *env) gatewayStdio(ctx context.Context, n int, data string) (*fleet, error) {
	if e.store == "sqlite" {
		// Create the SQLite file once, so that n processes do not race to create the schema.
		st, err := store.OpenSQLite(data, nil)
		if err != nil {
			return nil, err
		}
		if err := st.Close(); err != nil {
			return nil, err
		}
	}
	return connectCommands(ctx, n, func() *exec.Cmd {
		cmd := exec.Command(e.reversi, "gateway", "--config", e.cfgFile, "--manifests", e.manifests,
			"--store", e.store, "--data", data)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
		if p := os.Getenv("REVERSI_CPUPROFILE"); p != "" && n == 1 {
			cmd.Env = append(cmd.Env, "REVERSI_CPUPROFILE="+p) // the one stdio gateway's profile
		}
		return cmd
	})
}

// gatewayHTTP starts one gateway in this process journaling to SQLite in data (or, with
// pgURL, to that PostgreSQL database) and connects n Streamable HTTP sessions to it.
func (e *env) gatewayHTTP(ctx context.Context, n int, data, pgURL string) (*fleet, error) {
	cfg, errs := config.Load(e.cfgFile)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	docs, errs := manifest.ReadPaths(e.manifests)
	ms, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	var st store.Store = store.NewMemory(nil)
	if pgURL != "" {
		s, err := store.OpenPostgres(ctx, pgURL, nil)
		if err != nil {
			return nil, err
		}
		st = s
	} else if e.store == "sqlite" {
		s, err := store.OpenSQLite(data, nil)
		if err != nil {
			return nil, err
		}
		st = s
	}
	f := &fleet{}
	f.cleanup = append(f.cleanup, func() { _ = st.Close() })
	gwErr := &lockedBuffer{}
	gw, err := proxy.New(ctx, proxy.Options{Config: cfg, Manifests: ms, Store: st, Stderr: gwErr})
	if err != nil {
		f.close()
		return nil, fmt.Errorf("gateway: %w\nstderr:\n%s", err, gwErr)
	}
	f.cleanup = append(f.cleanup, func() { _ = gw.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.close()
		return nil, err
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- gw.ServeListener(sctx, ln) }()
	f.cleanup = append(f.cleanup, func() { stop(); <-done })
	url := "http://" + ln.Addr().String() + "/mcp"
	for range n {
		// Each session is its own client with its own connections, as separate agents are
		// (http.DefaultTransport would keep only 2 idle connections for 16 sessions).
		hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		cs, err := newClient().Connect(cctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, nil)
		cancel()
		if err != nil {
			f.close()
			return nil, fmt.Errorf("connect %s: %w\ngateway stderr:\n%s", url, err, gwErr)
		}
		f.sessions = append(f.sessions, cs)
	}
	return f, nil
}

func measure(ctx context.Context, sessions []*mcp.ClientSession, tool string, warmup, per int) (result, error) {
	return measureWith(ctx, sessions, tool, warmup, per, nil)
}

// measureWith runs warmup unmeasured calls on every session, then per measured calls on every
// session at once (one goroutine each), timing each call from send to answer. before runs
// between the two phases.
func measureWith(ctx context.Context, sessions []*mcp.ClientSession, tool string, warmup, per int, before func() error) (result, error) {
	run := func(count int, record bool) ([][]time.Duration, error) {
		samples := make([][]time.Duration, len(sessions))
		errs := make([]error, len(sessions))
		var wg sync.WaitGroup
		for i, cs := range sessions {
			wg.Go(func() {
				s := make([]time.Duration, 0, count)
				for range count {
					t0 := time.Now()
					res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{}})
					d := time.Since(t0)
					if err == nil && res.IsError {
						err = fmt.Errorf("isError: %s", resultText(res))
					}
					if err != nil {
						errs[i] = fmt.Errorf("session %d: %s: %w", i, tool, err)
						return
					}
					if record {
						s = append(s, d)
					}
				}
				samples[i] = s
			})
		}
		wg.Wait()
		return samples, errors.Join(errs...)
	}
	if _, err := run(warmup, false); err != nil {
		return result{}, fmt.Errorf("warm-up: %w", err)
	}
	runtime.GC() // start measuring without the warm-up's garbage
	if before != nil {
		if err := before(); err != nil {
			return result{}, err
		}
	}
	t0 := time.Now()
	samples, err := run(per, true)
	wall := time.Since(t0)
	if err != nil {
		return result{}, err
	}
	return newResult(samples, wall), nil
}

func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	return strings.Join(parts, " ")
}

// checkJournal reads the SQLite journal in data back and checks that it holds exactly want
// calls of read_graph, each an allowed intent followed by a succeeded outcome.
func (e *env) checkJournal(ctx context.Context, data string, want int) error {
	if e.store != "sqlite" {
		return nil // the memory store went with the gateway
	}
	st, err := store.OpenSQLite(data, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	return countJournal(ctx, st, st.Path(), want)
}

// checkJournalPostgres is checkJournal for a PostgreSQL database.
func (e *env) checkJournalPostgres(ctx context.Context, url string, want int) error {
	st, err := store.OpenPostgres(ctx, url, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	return countJournal(ctx, st, "PostgreSQL", want)
}

// countJournal checks that st holds exactly want calls of read_graph, each an allowed intent
// followed by a succeeded outcome; where names the journal in errors.
func countJournal(ctx context.Context, st store.Store, where string, want int) error {
	runs, err := st.ListRuns(ctx, store.RunFilter{})
	if err != nil {
		return err
	}
	intents, outcomes := 0, 0
	for _, r := range runs {
		recs, err := st.Records(ctx, r.ID, 0, 0)
		if err != nil {
			return err
		}
		for _, rec := range recs {
			if rec.Tool != gatewayTool {
				continue
			}
			switch {
			case rec.Kind == store.KindIntent && rec.Decision == "allow" && rec.ManifestChecksum != "":
				intents++
			case rec.Kind == store.KindOutcome && rec.Status == store.Succeeded:
				outcomes++
			default:
				return fmt.Errorf("journal %s: unexpected record %+v", where, rec)
			}
		}
	}
	if intents != want || outcomes != want {
		return fmt.Errorf("journal %s: %d allowed intents and %d succeeded outcomes of %s, want %d of each",
			where, intents, outcomes, gatewayTool, want)
	}
	return nil
}

// row is one line of the table; base is the direct row its added p50 is measured against.
type row struct {
	name, topology string
	sessions       int
	res            result
	base           *row
	gatewayCPU     time.Duration // CPU time of the gateway processes while measuring (stdio rows)
}

func printTable(w io.Writer, rows []row, notes []string) {
	fmt.Fprintf(w, "read_graph of @modelcontextprotocol/server-memory (20 entities, 20 relations); %s/%s, %d CPUs, %s\n\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version())
	fmt.Fprintln(w, "| path | sessions | calls | calls/s | p50 ms | p99 ms | added p50 vs direct | gateway CPU ms per call |")
	fmt.Fprintln(w, "| - | -: | -: | -: | -: | -: | -: | -: |")
	for _, r := range rows {
		added, cpu := "—", "—"
		if r.base != nil {
			added = fmt.Sprintf("%+.3f ms", ms(r.res.percentile(50))-ms(r.base.res.percentile(50)))
		}
		if r.gatewayCPU > 0 {
			cpu = fmt.Sprintf("%.3f", ms(r.gatewayCPU)/float64(r.res.calls))
		}
		fmt.Fprintf(w, "| %s | %d | %d | %.0f | %.3f | %.3f | %s | %s |\n", r.name, r.sessions, r.res.calls,
			r.res.perSecond(), ms(r.res.percentile(50)), ms(r.res.percentile(99)), added, cpu)
	}
	fmt.Fprintln(w, "\nTopology:")
	for _, r := range rows {
		fmt.Fprintf(w, "- %s, %d: %s\n", r.name, r.sessions, r.topology)
	}
	fmt.Fprintln(w)
	for _, n := range notes {
		fmt.Fprintln(w, "- "+n)
	}
}
