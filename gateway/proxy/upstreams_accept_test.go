package proxy

// Acceptance of issue 5 against @modelcontextprotocol/server-filesystem and
// @modelcontextprotocol/server-everything (real npm servers, test/upstreams): the banner
// classifies every tool, schema violations are blocked with the problems listed, results pass
// through unchanged, unclassified_reads: observe, and output schemas.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// stdioUpstream is a namespaced stdio upstream from an upstreams helper's command line.
func stdioUpstream(name, cmd string, args, env []string) config.Upstream {
	u := config.Upstream{Name: name, Command: cmd, Args: args, Env: map[string]string{}, Namespace: true}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		u.Env[k] = v
	}
	return u
}

// fsEverythingConfig fronts server-filesystem (allowed root only) as "fs" and, with
// everything, server-everything as "everything".
func fsEverythingConfig(t *testing.T, root string, mode config.Mode, reads string, everything bool) *config.Gateway {
	cmd, args, env := upstreams.Filesystem(t, root)
	ups := []config.Upstream{stdioUpstream("fs", cmd, args, env)}
	if everything {
		cmd, args, env = upstreams.Everything(t)
		ups = append(ups, stdioUpstream("everything", cmd, args, env))
	}
	return &config.Gateway{Mode: mode, UnclassifiedReads: reads, ValidateSchemas: true,
		Actor: "dev-laptop", Upstreams: ups}
}

// manifestsOf validates manifests given as YAML.
func manifestsOf(t *testing.T, yaml string) []*manifest.Manifest {
	t.Helper()
	p := filepath.Join(t.TempDir(), "manifests.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	docs, errs := manifest.ReadPaths(p)
	ms, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		t.Fatalf("manifests: %v", errs)
	}
	return ms
}

// wireLog keeps the raw JSON `result` of every response a client read, in order, as the
// go-sdk LoggingTransport writes them ("read: <message>").
type wireLog struct {
	mu      sync.Mutex
	results []json.RawMessage
}

func (w *wireLog) Write(p []byte) (int, error) {
	line, ok := strings.CutPrefix(string(p), "read: ")
	if !ok {
		return len(p), nil
	}
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Result json.RawMessage `json:"result"`
	}
	if json.Unmarshal([]byte(line), &msg) == nil && len(msg.ID) > 0 && len(msg.Result) > 0 {
		w.mu.Lock()
		w.results = append(w.results, msg.Result)
		w.mu.Unlock()
	}
	return len(p), nil
}

// last is the raw result of the latest response.
func (w *wireLog) last(t *testing.T) json.RawMessage {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.results) == 0 {
		t.Fatal("no response was read")
	}
	return w.results[len(w.results)-1]
}

// connectLogged connects a go-sdk client over transport, logging the raw responses it reads.
func connectLogged(t *testing.T, transport mcp.Transport) (*mcp.ClientSession, *wireLog) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w := &wireLog{}
	// Sampling and elicitation declared, as the gateway's shared upstream sessions do: some
	// servers (server-everything) list tools by the client's capabilities.
	opts := &mcp.ClientOptions{
		CreateMessageHandler: func(context.Context, *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			return nil, errors.New("no sampling in this test")
		},
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return nil, errors.New("no elicitation in this test")
		},
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "accept", Version: "1"}, opts).Connect(ctx,
		&mcp.LoggingTransport{Transport: transport, Writer: w}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs, w
}

// direct starts a second instance of an upstream and connects a go-sdk client straight to it.
func direct(t *testing.T, cmd string, args, env []string) (*mcp.ClientSession, *wireLog) {
	t.Helper()
	// server-everything does not exit when its stdin closes: stop it after a short wait
	// instead of the transport's default 5 s.
	return connectLogged(t, &mcp.CommandTransport{Command: upstreams.Command(cmd, args, env),
		TerminateDuration: 500 * time.Millisecond})
}

// wireClient is fixture.client with the raw responses logged.
func (f *fixture) wireClient(t *testing.T) (*mcp.ClientSession, *wireLog) {
	t.Helper()
	ct, stt := mcp.NewInMemoryTransports()
	ss, err := f.gw.Server().Connect(context.Background(), stt, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	return connectLogged(t, ct)
}

// listTools lists every tool (every page).
func listTools(t *testing.T, cs *mcp.ClientSession) []*mcp.Tool {
	t.Helper()
	var out []*mcp.Tool
	for tool, err := range cs.Tools(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tool)
	}
	return out
}

// bannerLines cuts the classification banner out of the gateway's stderr (which also holds
// the upstreams' own stderr): from the mode line to the last line before the next blank line.
func bannerLines(t *testing.T, stderr string) []string {
	t.Helper()
	i := strings.Index(stderr, "Reversi gateway running in ")
	if i < 0 {
		t.Fatalf("no banner on stderr:\n%s", stderr)
	}
	block, _, _ := strings.Cut(stderr[i:], "\n\n")
	return strings.Split(strings.TrimRight(block, "\n"), "\n")
}

// expectedClass is the seed's banner rule for a tool without a manifest (Observe first: NOTE
// when the server says read-only, BLOCK when it says destructive, WARN otherwise).
func expectedClass(a *mcp.ToolAnnotations) string {
	switch {
	case a != nil && a.DestructiveHint != nil && *a.DestructiveHint:
		return "BLOCK %s - no manifest and the server says it is destructive"
	case a != nil && a.ReadOnlyHint:
		return "NOTE %s - no manifest; the server says it is read-only (unverified)"
	default:
		return "WARN %s - no manifest; treated as a change that could not be undone"
	}
}

func TestBannerClassifiesEveryFilesystemAndEverythingTool(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	// The upstreams' own tools/list, from second instances.
	fsCmd, fsArgs, fsEnv := upstreams.Filesystem(t, root)
	fsDirect, _ := direct(t, fsCmd, fsArgs, fsEnv)
	evCmd, evArgs, evEnv := upstreams.Everything(t)
	evDirect, _ := direct(t, evCmd, evArgs, evEnv)
	own := map[string]*mcp.Tool{}
	for _, tool := range listTools(t, fsDirect) {
		own["fs."+tool.Name] = tool
	}
	for _, tool := range listTools(t, evDirect) {
		own["everything."+tool.Name] = tool
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range own {
			if !yield(n) {
				return
			}
		}
	})
	if len(names) < 20 {
		t.Fatalf("the upstreams list only %d tools: %v", len(names), names)
	}

	check := func(t *testing.T, ms []*manifest.Manifest, wantMode string, ok map[string]string, tail string) {
		f := start(t, fsEverythingConfig(t, root, config.ModeAuto, config.UnclassifiedBlock, true), ms)
		lines := bannerLines(t, f.stderr.String())
		if lines[0] != "Reversi gateway running in "+wantMode+" mode." {
			t.Errorf("first banner line %q", lines[0])
		}
		var want []string
		classified, reads, changes, destructive := 0, 0, 0, 0
		for _, n := range names {
			if detail, has := ok[n]; has {
				want = append(want, "OK "+n+" - "+detail)
				classified++
				continue
			}
			line := fmt.Sprintf(expectedClass(own[n].Annotations), n)
			want = append(want, line)
			switch {
			case strings.HasPrefix(line, "NOTE"):
				reads++
			case strings.HasPrefix(line, "BLOCK"):
				changes++
				destructive++
			default:
				changes++
			}
		}
		if len(lines) < len(want)+1 || !slices.Equal(lines[1:len(want)+1], want) {
			t.Fatalf("banner tool lines:\n%s\nwant one per upstream tool:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
		}
		summary := fmt.Sprintf("%d classified, %d unclassified reads, %d unclassified changes, %d destructive without a manifest.",
			classified, reads, changes, destructive)
		wantTail := []string{summary,
			fmt.Sprintf("%d tools have no manifest. %s", reads+changes, tail),
			"Draft manifests with: reversi suggest-manifest."}
		if got := lines[len(want)+1:]; !slices.Equal(got, wantTail) {
			t.Errorf("banner ends with:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantTail, "\n"))
		}
		t.Logf("banner: %s", summary)
	}

	t.Run("observe without manifests", func(t *testing.T) {
		t.Parallel()
		check(t, nil, "observe", nil, "They run (nothing is blocked) and are journaled as unclassified.")
		// The rule above mirrors the seed; anchor it to what these servers publish.
		f := start(t, fsEverythingConfig(t, root, config.ModeAuto, config.UnclassifiedBlock, false), nil)
		out := f.stderr.String()
		for _, want := range []string{
			engine.AutoObserveMessage,
			"NOTE fs.read_text_file - no manifest; the server says it is read-only (unverified)\n",
			"NOTE fs.list_allowed_directories - ",
			"BLOCK fs.write_file - no manifest and the server says it is destructive\n",
			"BLOCK fs.move_file - ",
			"WARN fs.create_directory - no manifest; treated as a change that could not be undone\n",
			"0 classified, 10 unclassified reads, 4 unclassified changes, 3 destructive without a manifest.\n",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("stderr lacks %q:\n%s", want, out)
			}
		}
		if strings.Index(out, engine.AutoObserveMessage) > strings.Index(out, "Reversi gateway running in observe mode.") {
			t.Errorf("the auto-observe message comes after the banner:\n%s", out)
		}
	})
	t.Run("enforce with manifests for filesystem tools", func(t *testing.T) {
		t.Parallel()
		ms := manifestsOf(t, `
- tool: fs.read_text_file
  description: Read a text file.
  effect: read_only
  permission: fs:read
- tool: fs.write_file
  description: Write a file.
  effect: idempotent
  permission: fs:write
- tool: fs.list_directory
  description: List a folder.
  effect: read_only
  permission: fs:read
  status: draft
`)
		check(t, ms, "enforce", map[string]string{
			"fs.read_text_file": "read_only, approved",
			"fs.write_file":     "idempotent, approved",
			"fs.list_directory": "read_only, draft",
		}, "They are blocked in enforce mode.")
	})
}

// schemaManifests cover the tools the schema test calls, so that in enforce mode the input
// schema is the only rule they can break.
const schemaManifests = `
- tool: fs.write_file
  description: Write a file.
  effect: idempotent
  permission: fs:write
- tool: fs.read_multiple_files
  description: Read files.
  effect: read_only
  permission: fs:read
- tool: everything.get-structured-content
  description: Weather.
  effect: read_only
  permission: everything:read
- tool: everything.get-resource-links
  description: Links.
  effect: read_only
  permission: everything:read
`

func TestSchemaViolationsAgainstFilesystemAndEverything(t *testing.T) {
	t.Parallel()
	type bad struct {
		tool     string
		args     map[string]any
		problems string // after "arguments do not match the tool's input schema: "
		file     string // a file the call would create, "" if none
	}
	cases := func(root string) []bad {
		return []bad{
			{"fs.write_file", map[string]any{"path": filepath.Join(root, "missing.txt")},
				"/: missing property 'content'", filepath.Join(root, "missing.txt")},
			{"fs.write_file", map[string]any{"path": filepath.Join(root, "wrongtype.txt"), "content": 42},
				"/content: got number, want string", filepath.Join(root, "wrongtype.txt")},
			{"fs.write_file", map[string]any{"path": 7, "content": true, "mode": "0600"},
				"/content: got boolean, want string; /path: got number, want string", ""},
			{"fs.read_multiple_files", map[string]any{"paths": []any{1, 2, 3, 4, 5, 6, 7}},
				"/paths/0: got number, want string; /paths/1: got number, want string; /paths/2: got number, want string; " +
					"/paths/3: got number, want string; /paths/4: got number, want string (and 2 more)", ""},
			{"everything.get-structured-content", map[string]any{"location": "Paris"},
				"/location: value must be one of 'New York', 'Chicago', 'Los Angeles'", ""},
			{"everything.get-resource-links", map[string]any{"count": 11},
				"/count: maximum: got 11, want 10", ""},
		}
	}

	t.Run("enforce blocks and does not forward", func(t *testing.T) {
		t.Parallel()
		root := t.TempDir()
		f := start(t, fsEverythingConfig(t, root, config.ModeEnforce, config.UnclassifiedBlock, true), manifestsOf(t, schemaManifests))
		cs := f.client(t)
		for _, c := range cases(root) {
			res := call(t, cs, c.tool, c.args)
			want := engine.BlockedPrefix + engine.InputSchemaPrefix + c.problems
			if !res.IsError || !slices.Equal(texts(res), []string{want}) {
				t.Errorf("%s %v: isError %v %q\nwant %q", c.tool, c.args, res.IsError, texts(res), want)
			}
			if c.file != "" {
				if _, err := os.Stat(c.file); !os.IsNotExist(err) {
					t.Errorf("%s reached the upstream: %s exists (%v)", c.tool, c.file, err)
				}
			}
		}
		// Control: the same tool with valid arguments reaches the upstream. An extra property is
		// no violation: neither server's input schemas set additionalProperties: false.
		ok := filepath.Join(root, "ok.txt")
		if res := call(t, cs, "fs.write_file", map[string]any{"path": ok, "content": "hello", "mode": "0600"}); res.IsError {
			t.Fatalf("valid write_file: %v", texts(res))
		}
		if b, err := os.ReadFile(ok); err != nil || string(b) != "hello" {
			t.Fatalf("valid write_file did not write: %q %v", b, err)
		}

		_, recs := onlyRun(t, f.store)
		wf := stepsOf(recs, "fs.write_file")
		if len(wf) != 4 {
			t.Fatalf("write_file steps %+v, want 3 blocked and 1 succeeded", wf)
		}
		// The blocked calls are journaled in call order, each as block / blocked with the problems.
		nth := map[string]int{}
		for _, c := range cases(root) {
			s := stepsOf(recs, c.tool)
			i := nth[c.tool]
			nth[c.tool]++
			if i >= len(s) {
				t.Errorf("%s: no step %d in %+v", c.tool, i, s)
				continue
			}
			in, out := s[i][0], s[i][1]
			if in.Decision != "block" || in.Mode != "enforce" || out.Status != store.Blocked ||
				out.Note != engine.InputSchemaPrefix+c.problems {
				t.Errorf("%s journaled %+v / %+v", c.tool, in, out)
			}
		}
		if last := wf[3]; last[0].Decision != "allow" || last[1].Status != store.Succeeded {
			t.Errorf("valid write_file journaled %+v", last)
		}
	})

	for _, mode := range []config.Mode{config.ModeObserve, config.ModeAdvise} {
		t.Run(string(mode)+" runs and journals would_block", func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			f := start(t, fsEverythingConfig(t, root, mode, config.UnclassifiedBlock, false), manifestsOf(t, schemaManifests))
			cs := f.client(t)
			c := cases(root)[1] // write_file with content: 42
			res := call(t, cs, c.tool, c.args)
			tx := texts(res)
			// The upstream got the call: the answer is its own (it rejects the number itself,
			// so the step is journaled failed).
			if !res.IsError || len(tx) == 0 || strings.HasPrefix(tx[0], engine.BlockedPrefix) {
				t.Fatalf("%s: %q, want the upstream's own answer", mode, tx)
			}
			t.Logf("%s: the upstream answered isError=%v %q", mode, res.IsError, tx[0])
			advisory := engine.AdvisoryPrefix + engine.InputSchemaPrefix + c.problems
			if mode == config.ModeAdvise && tx[len(tx)-1] != advisory || mode == config.ModeObserve && slices.Contains(tx, advisory) {
				t.Errorf("%s: result texts %q", mode, tx)
			}
			_, recs := onlyRun(t, f.store)
			s := stepsOf(recs, c.tool)
			if len(s) != 1 || s[0][0].Decision != "would_block" || s[0][0].Mode != string(mode) ||
				s[0][1].Status != store.Failed || !strings.Contains(s[0][1].Note, "would_block: "+engine.InputSchemaPrefix+c.problems) {
				t.Errorf("%s steps %+v", mode, s)
			}
		})
	}
}

// tinyPNG is a 1x1 PNG for read_media_file.
const tinyPNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="

// stripEnvelope removes from a result what the gateway's go-sdk server adds to every result
// for clients of the newer protocol version (the direct TS upstream negotiates an older one):
// `resultType: "complete"` and `_meta["io.modelcontextprotocol/serverInfo"]` naming the
// gateway (SEP-2575). Everything else must be the upstream's.
func stripEnvelope(t *testing.T, res map[string]any) {
	t.Helper()
	if rt, ok := res["resultType"]; ok && rt != "complete" {
		t.Errorf("resultType %v", rt)
	}
	delete(res, "resultType")
	meta, _ := res["_meta"].(map[string]any)
	if info, _ := meta[mcp.MetaKeyServerInfo].(map[string]any); info != nil && info["name"] == Name {
		delete(meta, mcp.MetaKeyServerInfo)
		if len(meta) == 0 {
			delete(res, "_meta")
		}
	}
}

func TestResultsPassThroughUnchanged(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "notes.txt"), []byte("first line\nsecond: ünïcödé ✓\n\"quoted\" <tag> & done\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	png, _ := base64.StdEncoding.DecodeString(tinyPNG)
	if err := os.WriteFile(filepath.Join(root, "dot.png"), png, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	f := start(t, fsEverythingConfig(t, root, config.ModeAuto, config.UnclassifiedBlock, true), nil)
	gw, gwLog := f.wireClient(t)
	fsCmd, fsArgs, fsEnv := upstreams.Filesystem(t, root)
	fsDirect, fsLog := direct(t, fsCmd, fsArgs, fsEnv)
	evCmd, evArgs, evEnv := upstreams.Everything(t)
	evDirect, evLog := direct(t, evCmd, evArgs, evEnv)

	gz := "data:text/plain;base64," + base64.StdEncoding.EncodeToString([]byte("compress me, please"))
	calls := []struct {
		tool string
		args map[string]any
	}{
		{"fs.read_text_file", map[string]any{"path": filepath.Join(root, "notes.txt")}},
		{"fs.read_text_file", map[string]any{"path": filepath.Join(root, "notes.txt"), "head": 1}},
		{"fs.list_directory", map[string]any{"path": root}},
		{"fs.read_media_file", map[string]any{"path": filepath.Join(root, "dot.png")}},
		{"fs.read_text_file", map[string]any{"path": filepath.Join(root, "absent.txt")}}, // isError
		{"everything.echo", map[string]any{"message": "héllo \u2028 <b>"}},
		{"everything.get-sum", map[string]any{"a": 2.5, "b": 40}},
		{"everything.get-structured-content", map[string]any{"location": "Chicago"}},
		{"everything.get-tiny-image", map[string]any{}},
		{"everything.get-annotated-message", map[string]any{"messageType": "success", "includeImage": true}},
		{"everything.gzip-file-as-resource", map[string]any{"data": gz, "name": "note.gz", "outputType": "resource"}},
	}
	seen := map[string]bool{}
	for _, c := range calls {
		upName, tool, _ := strings.Cut(c.tool, ".")
		dcs, dlog := fsDirect, fsLog
		if upName == "everything" {
			dcs, dlog = evDirect, evLog
		}
		call(t, gw, c.tool, c.args)
		call(t, dcs, tool, c.args)
		got, want := gwLog.last(t), dlog.last(t)
		var g, w map[string]any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(want, &w); err != nil {
			t.Fatal(err)
		}
		stripEnvelope(t, g)
		if !reflect.DeepEqual(g, w) {
			for _, k := range []string{"content", "structuredContent", "isError", "_meta"} {
				if !reflect.DeepEqual(g[k], w[k]) {
					gk, _ := json.Marshal(g[k])
					wk, _ := json.Marshal(w[k])
					t.Errorf("%s %v: %s through the gateway:\n%s\ndirect:\n%s", c.tool, c.args, k, gk, wk)
				}
			}
		}
		if sc, ok := w["structuredContent"]; ok && sc != nil {
			seen["structuredContent"] = true
		}
		if w["isError"] == true {
			seen["isError"] = true
		}
		for _, item := range w["content"].([]any) {
			seen[item.(map[string]any)["type"].(string)] = true
		}
	}
	// The calls above cover every kind of result the test claims to compare.
	for _, kind := range []string{"text", "image", "resource", "structuredContent", "isError"} {
		if !seen[kind] {
			t.Errorf("no result had %s: %v", kind, seen)
		}
	}
}

func TestUnclassifiedReadsObserveInEnforce(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "a.txt"), []byte("alpha"), 0o600); err != nil {
		t.Fatal(err)
	}
	ms := manifestsOf(t, `
- tool: fs.read_text_file
  description: Read a text file.
  effect: read_only
  permission: fs:read
`)
	f := start(t, fsEverythingConfig(t, root, config.ModeEnforce, config.UnclassifiedObserve, true), ms)
	if !strings.Contains(f.stderr.String(), "They are blocked, except server-claimed reads, which run in a shadow observe run (unverified).\n") {
		t.Errorf("banner:\n%s", f.stderr.String())
	}
	cs := f.client(t)

	// A tool with a manifest runs in the main run.
	if res := call(t, cs, "fs.read_text_file", map[string]any{"path": filepath.Join(root, "a.txt")}); res.IsError || texts(res)[0] != "alpha" {
		t.Fatalf("read_text_file: %v", texts(res))
	}
	// Server-claimed reads without a manifest run, with the upstream's result.
	if res := call(t, cs, "fs.list_directory", map[string]any{"path": root}); res.IsError || !slices.Equal(texts(res), []string{"[FILE] a.txt"}) {
		t.Fatalf("list_directory: %v", texts(res))
	}
	if res := call(t, cs, "everything.echo", map[string]any{"message": "hi"}); res.IsError || !slices.Equal(texts(res), []string{"Echo: hi"}) {
		t.Fatalf("echo: %v", texts(res))
	}
	// Unclassified changes stay blocked, whatever else the server says about them.
	newDir := filepath.Join(root, "new")
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"fs.create_directory", map[string]any{"path": newDir}},                                                  // no readOnlyHint
		{"fs.move_file", map[string]any{"source": filepath.Join(root, "a.txt"), "destination": newDir + ".txt"}}, // destructive
		{"everything.toggle-simulated-logging", map[string]any{}},                                                // no readOnlyHint
	} {
		res := call(t, cs, c.tool, c.args)
		if want := engine.BlockedPrefix + engine.NoManifestText(c.tool); !res.IsError || !slices.Equal(texts(res), []string{want}) {
			t.Errorf("%s: %q, want %q", c.tool, texts(res), want)
		}
	}
	if _, err := os.Stat(newDir); !os.IsNotExist(err) {
		t.Errorf("create_directory reached the upstream: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "a.txt")); err != nil {
		t.Errorf("move_file reached the upstream: %v", err)
	}

	ctx := context.Background()
	runs, err := f.store.ListRuns(ctx, store.RunFilter{})
	if err != nil || len(runs) != 2 {
		t.Fatalf("runs %+v %v, want the session's run and its shadow", runs, err)
	}
	var main, shadow store.Run
	for _, r := range runs {
		if strings.HasSuffix(r.ID, engine.ShadowRunSuffix) {
			shadow = r
		} else {
			main = r
		}
	}
	if main.ID == "" || shadow.ID != main.ID+"-reads" {
		t.Fatalf("runs %+v, want <run> and <run>-reads", runs)
	}
	for _, r := range []store.Run{main, shadow} {
		if r.Actor != "dev-laptop" || r.Gateway != Name {
			t.Errorf("run %+v, want actor dev-laptop and gateway %s", r, Name)
		}
	}
	mainRecs, err := f.store.Records(ctx, main.ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	checkIntentBeforeOutcome(t, mainRecs)
	for _, r := range mainRecs {
		if r.Tool == "fs.list_directory" || r.Tool == "everything.echo" {
			t.Errorf("the main run holds a record of the unclassified read: %+v", r)
		}
	}
	if s := stepsOf(mainRecs, "fs.read_text_file"); len(s) != 1 || s[0][0].Decision != "allow" || s[0][1].Status != store.Succeeded {
		t.Errorf("read_text_file steps %+v", s)
	}
	for _, tool := range []string{"fs.create_directory", "fs.move_file", "everything.toggle-simulated-logging"} {
		s := stepsOf(mainRecs, tool)
		if len(s) != 1 || s[0][0].Decision != "block" || s[0][0].Mode != "enforce" || s[0][1].Status != store.Blocked ||
			s[0][1].Note != engine.NoManifestText(tool) {
			t.Errorf("%s steps %+v", tool, s)
		}
	}
	shadowRecs, err := f.store.Records(ctx, shadow.ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	checkIntentBeforeOutcome(t, shadowRecs)
	for _, tool := range []string{"fs.list_directory", "everything.echo"} {
		s := stepsOf(shadowRecs, tool)
		if len(s) != 1 || s[0][0].Decision != "allow" || s[0][0].Mode != "observe" || s[0][1].Status != store.Succeeded ||
			s[0][1].Note != engine.UnclassifiedReadNote {
			t.Errorf("%s steps in the shadow run %+v", tool, s)
		}
	}
	if n := len(stepsOf(shadowRecs, "fs.read_text_file")) + len(stepsOf(shadowRecs, "fs.create_directory")); n != 0 {
		t.Errorf("the shadow run holds %d steps of other tools", n)
	}
}

func TestOutputSchemaMatchIsForwarded(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "a.txt"), []byte("alpha"), 0o600); err != nil {
		t.Fatal(err)
	}
	ms := manifestsOf(t, `
- tool: everything.get-structured-content
  description: Weather.
  effect: read_only
  permission: everything:read
- tool: fs.read_text_file
  description: Read a text file.
  effect: read_only
  permission: fs:read
`)
	f := start(t, fsEverythingConfig(t, root, config.ModeEnforce, config.UnclassifiedBlock, true), ms)
	cs := f.client(t)
	byName := map[string]*mcp.Tool{}
	for _, tool := range listTools(t, cs) {
		byName[tool.Name] = tool
	}
	for _, n := range []string{"everything.get-structured-content", "fs.read_text_file"} {
		// Listed with the output schema (output_schemas: advertise, the default; issue 19).
		if byName[n] == nil || byName[n].OutputSchema == nil {
			t.Fatalf("%s is not listed, or listed without its output schema: %+v", n, byName[n])
		}
	}

	res := call(t, cs, "everything.get-structured-content", map[string]any{"location": "New York"})
	want := map[string]any{"temperature": 33.0, "conditions": "Cloudy", "humidity": 82.0}
	if res.IsError || !reflect.DeepEqual(res.StructuredContent, want) {
		t.Errorf("get-structured-content: isError %v structuredContent %#v, want %#v", res.IsError, res.StructuredContent, want)
	}
	res = call(t, cs, "fs.read_text_file", map[string]any{"path": filepath.Join(root, "a.txt")})
	if res.IsError || !reflect.DeepEqual(res.StructuredContent, map[string]any{"content": "alpha"}) {
		t.Errorf("read_text_file: isError %v structuredContent %#v", res.IsError, res.StructuredContent)
	}

	_, recs := onlyRun(t, f.store)
	for _, tool := range []string{"everything.get-structured-content", "fs.read_text_file"} {
		s := stepsOf(recs, tool)
		if len(s) != 1 || s[0][0].Decision != "allow" || s[0][1].Status != store.Succeeded || s[0][1].Note != "" {
			t.Errorf("%s steps %+v, want succeeded without a note", tool, s)
		}
	}
}
