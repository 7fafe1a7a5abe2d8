package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/test/pgtest"
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
	// calls is the measured calls of a row (split evenly over its sessions); warmup the
	// unmeasured calls per session before them, and warmupRow the least unmeasured calls of a
	// row (split over its sessions), so that a 1-session row warms its processes' JITs too.
	calls, warmup, warmupRow int
	// reps is how many times every row is measured, back to back on the same processes.
	reps     int
	sessions []int
	// paths are the keys of the paths to measure (all when empty); see allPaths.
	paths   []string
	reversi string
	keep    bool
	// postgres, when set, enables the gateway HTTP (PostgreSQL) path: it returns the URL of a
	// new empty database (the suite starts a throwaway server with test/pgtest).
	postgres func(context.Context) (string, error)
}

func gatewayMain(argv []string) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	var f gatewayFlags
	var sessions, paths string
	var withPG bool
	fs.IntVar(&f.calls, "calls", 600, "measured calls per row and repetition (split evenly over the sessions)")
	fs.IntVar(&f.warmup, "warmup", 5, "unmeasured calls per session before each repetition, at least")
	fs.IntVar(&f.warmupRow, "warmup-row", 100, "unmeasured calls per row before each repetition, at least (split over its sessions)")
	fs.IntVar(&f.reps, "reps", 3, "repetitions of every row (min and median are printed)")
	fs.StringVar(&sessions, "sessions", "1,16", "concurrent session counts, comma-separated")
	fs.StringVar(&paths, "paths", "", "paths to measure, comma-separated (default all): "+strings.Join(pathKeys(), ", "))
	fs.BoolVar(&withPG, "postgres", false, "also the gateway HTTP (PostgreSQL) path, on a throwaway server (test/pgtest)")
	fs.StringVar(&f.reversi, "reversi", "", "reversi binary for the gateway paths (default: go build of this module)")
	fs.BoolVar(&f.keep, "keep", false, "keep the temporary folder (journals, memory file, config)")
	if err := fs.Parse(argv); err != nil {
		return err
	}
	var err error
	if f.sessions, err = parseSessions(sessions); err != nil {
		return err
	}
	if paths != "" {
		f.paths = strings.Split(paths, ",")
	}
	if f.calls < 1 || f.warmup < 0 || f.warmupRow < 0 || f.reps < 1 {
		return errors.New("-calls and -reps must be positive, -warmup and -warmup-row not negative")
	}
	if withPG {
		pg, err := pgtest.Start()
		if err != nil {
			return err
		}
		defer pg.Stop()
		f.postgres = pg.NewDatabase
	}
	rows, notes, err := runGateway(f)
	if err != nil {
		return err
	}
	printTable(os.Stdout, rows, notes)
	fmt.Println()
	writeTargets(os.Stdout, rows)
	return nil
}

func parseSessions(s string) ([]int, error) {
	var out []int
	for _, v := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-sessions %q: want positive integers, e.g. 1,16", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// env is what every row shares: the seeded memory file, the manifest, the config, the binaries.
type env struct {
	dir       string
	memCmd    string
	memArgs   []string
	memEnv    []string
	manifests string         // manifest file
	cfg       map[string]any // gateway config (stdio); HTTP rows add listen
	cfgFile   string         // cfg as JSON (which config.Load reads as YAML)
	reversi   string
	self      string // this binary, which also runs the floor relay and the naive proxy
}

// runGateway measures every row f asks for and returns them with the table's notes.
func runGateway(f gatewayFlags) ([]*row, []string, error) {
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
	if e.self, err = os.Executable(); err != nil {
		return nil, nil, err
	}
	paths, err := selectPaths(f)
	if err != nil {
		return nil, nil, err
	}
	ctx := context.Background()
	byKey := map[string]*row{}
	var rows []*row
	for _, n := range f.sessions {
		per := max(f.calls/n, 1)
		warm := max(f.warmup, (f.warmupRow+n-1)/n)
		for _, p := range paths {
			if p.multi && n == 1 {
				continue
			}
			fmt.Fprintf(os.Stderr, "bench: %s, %d session(s): %d × (%d warm-up + %d measured calls each) ...\n", p.name, n, f.reps, warm, per)
			r, err := measureRow(ctx, e, p, n, f.reps, warm, per, filepath.Join(dir, fmt.Sprintf("%s-%d", p.key, n)))
			if err != nil {
				return nil, nil, fmt.Errorf("%s, %d session(s): %w", p.name, n, err)
			}
			byKey[fmt.Sprintf("%s/%d", p.key, n)] = r
			rows = append(rows, r)
		}
	}
	for _, r := range rows {
		if r.path.base == "" {
			continue
		}
		base := r.path.base
		if base == "direct1" && r.sessions == 1 {
			base = "direct" // one caller on one session: the same thing
		}
		r.base = byKey[fmt.Sprintf("%s/%d", base, r.sessions)]
	}
	notes := []string{
		fmt.Sprintf("repetitions: the processes of a row are started for it and stopped after it (rows in the order of the table); in between, %d repetitions, each of max(%d per session, %d per row) unmeasured warm-up calls, then %d measured calls split over the sessions. min and median are over the repetitions (for calls/s the min is the slowest).", f.reps, f.warmup, f.warmupRow, f.calls),
		"load avg: the 1-minute load average (/proc/loadavg) as each repetition began (the first: before the row's processes started).",
		"proxy CPU µs per call: user + system CPU time of the proxy's processes while the measured calls ran, divided by those calls: the process the clients talk to (all of them in a stdio row of several sessions) and its descendants except the server-memory upstreams (so supergateway's `sh -c` is counted), each read from its kernel CPU clock (clock_gettime of the pid's CPU clock, ns; /proc/<pid>/stat's utime + stime, the same time in 10 ms ticks) with the processes listed from /proc. The bench's own clients are not in it.",
		"added p50: the row's p50 minus the p50 of the direct row with the same upstreams (the row named in Topology): its min minus the direct row's min, its median minus the direct row's median.",
		"journal read-back: every reversi gateway row's journal was read after the row: one allowed intent and one succeeded outcome per call (warm-up included) in SQLite or PostgreSQL, and for the memory store through the gateway's own reversi.list_runs and reversi.get_run on each session before it closed; the floor's journal file holds one line per tools/call.",
		"direct HTTP: not measured: @modelcontextprotocol/server-memory speaks stdio only.",
	}
	if f.postgres != nil {
		notes = append(notes, "PostgreSQL rows: a throwaway server (test/pgtest, Debian's PostgreSQL, defaults: fsync=on, synchronous_commit=on) on 127.0.0.1, a new database per row.")
	}
	if p := os.Getenv("REVERSI_CPUPROFILE"); p != "" {
		notes = append(notes, "CPU profile of the 1-session gateway stdio (SQLite) row's gateway process (its whole life: warm-ups and repetitions): "+p)
	}
	if p := os.Getenv("REVERSI_HTTP_CPUPROFILE"); p != "" {
		notes = append(notes, "CPU profiles of the gateway HTTP rows' gateway process (its whole life): "+p+".<sessions> (SQLite), "+p+".pg.<sessions> (PostgreSQL)")
	}
	return rows, notes, nil
}

// measureRow starts path p for n sessions, measures reps repetitions on the same processes
// (each a warm-up of warm calls per session, then per measured calls per session), reads the
// journal back and stops the processes; data is the row's own place for its journal (a folder
// or a file).
func measureRow(ctx context.Context, e *env, p *path, n, reps, warm, per int, data string) (*row, error) {
	r := &row{path: p, sessions: n, topology: p.topology(n)}
	load := loadAverage()
	t0 := time.Now()
	fl, err := p.start(ctx, e, n, data)
	if err != nil {
		return nil, err
	}
	started := time.Since(t0)
	for i := range reps {
		if i > 0 {
			load = loadAverage()
		}
		s := repetition{load: load, cpu: -1}
		var pids []int
		var cpu0 time.Duration
		before := func() (err error) {
			if len(fl.proxies) == 0 {
				return nil
			}
			// Listed now: supergateway spawns its servers (and their shells) as sessions open.
			if pids, err = proxyProcesses(fl.proxies, e.isUpstream); err != nil {
				return err
			}
			cpu0, err = cpuTime(pids)
			return err
		}
		if s.res, err = measureWith(ctx, fl.sessions, p.tool, warm, per, before); err != nil {
			err = fmt.Errorf("repetition %d: %w", i+1, err)
			break
		}
		if pids != nil {
			var cpu1 time.Duration
			if cpu1, err = cpuTime(pids); err != nil {
				break
			}
			s.cpu, s.procs = cpu1-cpu0, len(pids)
		}
		r.samples = append(r.samples, s)
	}
	want := reps * n * (warm + per)
	if err == nil && fl.verifyLive != nil {
		err = fl.verifyLive(ctx, want)
	}
	fl.close()
	if err == nil && fl.verify != nil {
		err = fl.verify(ctx, want)
	}
	if err != nil {
		if fl.stderr != nil {
			err = fmt.Errorf("%w\nstderr:\n%s", err, tail(fl.stderr(), 4000))
		}
		return nil, err
	}
	var rates []string
	for _, s := range r.samples {
		rates = append(rates, fmt.Sprintf("%.0f", s.res.perSecond()))
	}
	fmt.Fprintf(os.Stderr, "bench:   %s calls/s; %s in all, %s of it starting\n", strings.Join(rates, ", "), time.Since(t0).Round(time.Millisecond), started.Round(time.Millisecond))
	return r, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// isUpstream reports whether argv is a server-memory process (node and its bin script).
func (e *env) isUpstream(argv []string) bool {
	return len(argv) >= 2 && argv[1] == e.memArgs[0]
}

// setup writes the seeded memory graph, the manifest and the gateway config, and builds the
// reversi binary unless one is given ("-": none is needed).
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
	e.cfg = map[string]any{
		"mode": "enforce", "unclassified_reads": "block", "validate_schemas": true, "actor": actor,
		"upstreams": []map[string]any{{"name": "memory", "command": e.memCmd, "args": e.memArgs, "env": upEnv}},
	}
	e.cfgFile = filepath.Join(dir, "gateway.yaml")
	if err := writeJSON(e.cfgFile, e.cfg); err != nil {
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

func writeJSON(file string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o600)
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

// fleet is a set of connected client sessions, the processes behind them, and how to check
// and take them down.
type fleet struct {
	sessions []*mcp.ClientSession
	pids     []int // the processes the sessions talk to (stdio)
	// proxies are the processes whose CPU is measured (with their descendants but the
	// upstreams); none for a direct row.
	proxies []int
	// verifyLive reads the journal back while the sessions are open, verify after close;
	// want is the calls made (one intent and one outcome each).
	verifyLive, verify func(ctx context.Context, want int) error
	// stderr returns what the processes wrote, for errors.
	stderr  func() string
	cleanup []func()
}

func (f *fleet) close() {
	var wg sync.WaitGroup
	closed := map[*mcp.ClientSession]bool{}
	for _, s := range f.sessions {
		if !closed[s] {
			closed[s] = true
			wg.Go(func() { _ = s.Close() }) // at once: a stdio session waits for its process to exit
		}
	}
	wg.Wait()
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
	f := &fleet{sessions: make([]*mcp.ClientSession, n), pids: make([]int, n)}
	bufs := make([]*lockedBuffer, n)
	f.stderr = func() string {
		var b strings.Builder
		for _, s := range bufs {
			if s != nil {
				b.WriteString(s.String())
			}
		}
		return b.String()
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			cmd := mk()
			bufs[i] = &lockedBuffer{}
			cmd.Stderr = bufs[i]
			cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			cs, err := newClient().Connect(cctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 5 * time.Second}, nil)
			if err != nil {
				errs[i] = fmt.Errorf("start %s: %w\nstderr:\n%s", cmd.Path, err, bufs[i])
				return
			}
			f.sessions[i] = cs
			f.pids[i] = cmd.Process.Pid
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		f.sessions = slices.DeleteFunc(f.sessions, func(s *mcp.ClientSession) bool { return s == nil })
		f.close()
		return nil, err
	}
	return f, nil
}

// measureWith runs warmup unmeasured calls on every session, then per measured calls on every
// session at once (one goroutine each), timing each call from send to answer. before runs
// between the two phases. Every call is bounded by callTimeout.
func measureWith(ctx context.Context, sessions []*mcp.ClientSession, tool string, warmup, per int, before func() error) (result, error) {
	run := func(count int, record bool) ([][]time.Duration, error) {
		samples := make([][]time.Duration, len(sessions))
		errs := make([]error, len(sessions))
		var wg sync.WaitGroup
		for i, cs := range sessions {
			wg.Go(func() {
				s := make([]time.Duration, 0, count)
				for range count {
					cctx, cancel := context.WithTimeout(ctx, callTimeout)
					t0 := time.Now()
					res, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{}})
					d := time.Since(t0)
					cancel()
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

// callTimeout bounds one measured call (a stuck path fails its row instead of hanging the
// bench).
const callTimeout = 60 * time.Second

func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	return strings.Join(parts, " ")
}

// repetition is one measurement of a row.
type repetition struct {
	load float64 // 1-minute load average when the repetition began
	res  result
	// cpu is the CPU time of the proxy's processes (procs of them) over the measured calls;
	// -1 for a direct row.
	cpu   time.Duration
	procs int
}

// row is one line of the table: a path at a session count, its repetitions, and the direct row
// its added p50 is measured against.
type row struct {
	path     *path
	sessions int
	topology string
	samples  []repetition
	base     *row
}

// stat is the min and median of one figure over a row's repetitions.
type stat struct{ min, med float64 }

func statOf(v []float64) stat {
	if len(v) == 0 {
		return stat{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stat{min: s[0], med: m}
}

func (r *row) stat(f func(repetition) float64) stat {
	var v []float64
	for _, s := range r.samples {
		v = append(v, f(s))
	}
	return statOf(v)
}

// rate, p50 and p99 are calls/s and latencies in ms.
func (r *row) rate() stat { return r.stat(func(s repetition) float64 { return s.res.perSecond() }) }
func (r *row) p50() stat {
	return r.stat(func(s repetition) float64 { return ms(s.res.percentile(50)) })
}
func (r *row) p99() stat {
	return r.stat(func(s repetition) float64 { return ms(s.res.percentile(99)) })
}

// cpuPerCall is the proxy's CPU µs per measured call; ok is false for a direct row.
func (r *row) cpuPerCall() (st stat, ok bool) {
	if len(r.samples) == 0 || r.samples[0].cpu < 0 {
		return stat{}, false
	}
	return r.stat(func(s repetition) float64 { return float64(s.cpu) / float64(time.Microsecond) / float64(s.res.calls) }), true
}

// addedP50 is the row's p50 minus its direct row's, in ms: the min minus the direct row's
// min, and the median minus its median; ok is false without a direct row.
func (r *row) addedP50() (st stat, ok bool) {
	if r.base == nil || len(r.base.samples) == 0 {
		return stat{}, false
	}
	p, b := r.p50(), r.base.p50()
	return stat{min: p.min - b.min, med: p.med - b.med}, true
}

func (r *row) loads() string {
	var l []string
	for _, s := range r.samples {
		l = append(l, fmt.Sprintf("%.2f", s.load))
	}
	return strings.Join(l, ", ")
}

func printTable(w io.Writer, rows []*row, notes []string) {
	fmt.Fprintf(w, "read_graph of @modelcontextprotocol/server-memory (20 entities, 20 relations); %s/%s, %d CPUs, %s. Each cell: min / median.\n\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version())
	fmt.Fprintln(w, "| path | sessions | calls per repetition | load avg at start | calls/s | p50 ms | p99 ms | added p50 ms | proxy CPU µs per call |")
	fmt.Fprintln(w, "| - | -: | -: | -: | -: | -: | -: | -: | -: |")
	for _, r := range rows {
		added, cpu := "—", "—"
		if a, ok := r.addedP50(); ok {
			added = fmt.Sprintf("%+.2f / %+.2f", a.min, a.med)
		}
		if c, ok := r.cpuPerCall(); ok {
			cpu = fmt.Sprintf("%s / %s", thousands(c.min), thousands(c.med))
		}
		rate, p50, p99 := r.rate(), r.p50(), r.p99()
		fmt.Fprintf(w, "| %s | %d | %d | %s | %.0f / %.0f | %.2f / %.2f | %.2f / %.2f | %s | %s |\n", r.path.name, r.sessions, r.samples[0].res.calls,
			r.loads(), rate.min, rate.med, p50.min, p50.med, p99.min, p99.med, added, cpu)
	}
	fmt.Fprintln(w, "\nTopology (and the direct row each is compared with):")
	for _, r := range rows {
		extra := ""
		if p := r.samples[0].procs; p > 0 {
			extra = fmt.Sprintf("; CPU of %d process(es)", p)
		}
		if r.base != nil {
			extra += fmt.Sprintf(" — vs %s, %d", r.base.path.name, r.base.sessions)
		}
		fmt.Fprintf(w, "- %s, %d: %s%s\n", r.path.name, r.sessions, r.topology, extra)
	}
	fmt.Fprintln(w)
	for _, n := range notes {
		fmt.Fprintln(w, "- "+n)
	}
}
