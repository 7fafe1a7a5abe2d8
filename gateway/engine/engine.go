// Package engine is the gateway's decision for one `tools/call`: manifest and lifecycle,
// scope, requires, schema checks, schema drift, allow/deny, approval and the duplicate-call
// key, applied in the mode the gateway runs in. It does no I/O except through store.Store
// (duplicate-call keys and the approval queue), so it is tested with store.NewMemory.
//
// Source: DESIGN.md "The call path"; seed "MCP gateway"
// (../shared/seeds/003_0ebd38203277749f.txt): Observe first, Modes, What happens to a call,
// Schema validation, MCP annotations are hints, Schema drift, Timeout and retry; seed "Tool
// manifests" (000): Lifecycle, Duplicate calls, Schema drift; issue 5.
//
// An Engine is immutable once built. A reload builds a new Engine and swaps it into a Holder;
// calls already deciding keep the Engine they loaded.
package engine

import (
	"context"
	"fmt"
	"path"
	"sort"
	"sync/atomic"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/policy"
)

// Mode is how the gateway treats a call that breaks a rule (seed: Modes).
type Mode string

const (
	Enforce Mode = "enforce" // blocked; the model gets the reason as an isError result
	Advise  Mode = "advise"  // runs with an advisory text block; journaled would_block
	Observe Mode = "observe" // runs; journaled would_block; nothing added to the result
)

// UnclassifiedReads is the `unclassified_reads` setting (seed: Modes).
type UnclassifiedReads string

const (
	ReadsBlock   UnclassifiedReads = "block"   // the default
	ReadsObserve UnclassifiedReads = "observe" // server-claimed reads run in a shadow observe run
)

// Texts of the seed.
const (
	// AutoObserveMessage is printed on start when no manifests loaded and no mode was named
	// (seed: Observe first).
	AutoObserveMessage = "reversi-gateway: no manifests yet, so starting in observe mode: everything runs and is journaled. Run `reversi suggest-manifest` to draft manifests for what the upstream offers."
	// UnclassifiedReadNote is the note of a shadow observe run (seed: Modes).
	UnclassifiedReadNote = "unclassified read: the server says it is read-only; this is unverified"
	// UnclassifiedNote is the note of a call to a tool without a manifest that runs (advise
	// and observe; seed: Observe first, "journaled as unclassified").
	UnclassifiedNote = "unclassified: no manifest"
	// ShadowRunSuffix names the shadow run of unclassified reads: `<run>-reads`.
	ShadowRunSuffix = "-reads"
	// BlockedPrefix and AdvisoryPrefix start the text the model reads (seed: Modes).
	BlockedPrefix  = "Blocked by Reversi: "
	AdvisoryPrefix = "Reversi advisory (nothing was blocked): "
	// DefaultApprovalTimeout is the expiry of an approval request whose manifest names no
	// timeout (the seeds are silent).
	DefaultApprovalTimeout = 24 * time.Hour
	// MaxPendingApprovalsPerActor is how many approval requests of one actor may wait at once:
	// a held call beyond it is blocked rather than queued (and announced). As
	// ReversiRun status.pendingApprovals' bound.
	MaxPendingApprovalsPerActor = 50
)

// Tool is an upstream tool as offered by `tools/list`: its name (as exposed by the gateway),
// schemas (any JSON-encodable value; nil when absent) and the annotations the engine reads.
type Tool struct {
	Name            string
	InputSchema     any
	OutputSchema    any
	ReadOnlyHint    bool
	DestructiveHint bool
}

// Config is everything an Engine is built from. The zero value of each field is the seed's
// default, except Store, which is required.
type Config struct {
	// Manifests are the loaded manifests (a registry has already skipped drafts; a plain
	// folder may hold them). Two with one tool name are an error.
	Manifests []*manifest.Manifest
	// Mode: "" is automatic: observe when no manifests loaded, enforce otherwise. The mode is
	// fixed at start: a reload passes the running Engine's Mode() explicitly.
	Mode Mode
	// UnclassifiedReads: "" is block.
	UnclassifiedReads UnclassifiedReads
	// Permissions is the scope of every session; empty means every permission in Manifests.
	Permissions []string
	// Allow and Deny are tool-name globs (path.Match syntax). A non-empty Allow admits only
	// the tools it matches; Deny refuses the tools it matches.
	Allow, Deny []string
	// ValidateSchemas: nil means true (the seed's default).
	ValidateSchemas *bool
	// Tools are the upstream tools as offered by `tools/list`.
	Tools []Tool
	// Store holds duplicate-call keys and the approval queue. Required.
	Store store.Store
	// Succeeded reports whether tool succeeded earlier in run (for `requires`). nil: nothing
	// has succeeded, so every requirement fails.
	Succeeded func(ctx context.Context, run, tool string) bool
	// Now is the clock for approval expiry and the policy's `now`; nil is time.Now.
	Now func() time.Time
	// Policy is the compiled policy set, run after allow/deny (seed "MCP gateway", What
	// happens to a call, step 2: "policy, content checks"); nil: no policy.
	Policy *policy.Set
	// Environment and Gateway are the policy's `environment` and `gateway` variables
	// (--environment; the gateway's name).
	Environment, Gateway string
	// Counter counts the calls of limit rules (the store); nil: a limit rule that matches
	// denies, as it cannot be counted.
	Counter policy.Counter
	// RunSteps returns the steps of run so far, for the policy's `run` variable; nil: none.
	// It is called only for a call that a rule reading `run` matches.
	RunSteps func(ctx context.Context, run string) ([]policy.Step, error)
}

// upstreamTool is a Tool with its compiled schemas.
type upstreamTool struct {
	Tool
	input, output       *jsonschema.Schema
	inputErr, outputErr error
	inputHash           string // full hex SHA-256 of the canonical input schema, "" if none
}

// Engine decides calls. Build it with New; it is immutable and safe for concurrent use.
type Engine struct {
	mode        Mode
	autoObserve bool
	reads       UnclassifiedReads
	validate    bool
	scope       map[string]bool
	scopeList   []string
	allow, deny []string
	manifests   map[string]*manifest.Manifest
	tools       map[string]*upstreamTool
	toolOrder   []string
	store       store.Store
	succeeded   func(ctx context.Context, run, tool string) bool
	now         func() time.Time
	policy      *policy.Set
	environment string
	gateway     string
	counter     policy.Counter
	runSteps    func(ctx context.Context, run string) ([]policy.Step, error)
}

// New builds an Engine. It fails on an unknown mode or unclassified_reads value, a bad glob,
// a nil manifest, two manifests for one tool, two upstream tools with one name, or a nil
// Store. An upstream schema that does not compile is not an error: the tool's calls carry a
// note saying the schema could not be checked.
func New(cfg Config) (*Engine, error) {
	e := &Engine{
		reads:       cfg.UnclassifiedReads,
		validate:    cfg.ValidateSchemas == nil || *cfg.ValidateSchemas,
		allow:       append([]string(nil), cfg.Allow...),
		deny:        append([]string(nil), cfg.Deny...),
		manifests:   make(map[string]*manifest.Manifest, len(cfg.Manifests)),
		tools:       make(map[string]*upstreamTool, len(cfg.Tools)),
		store:       cfg.Store,
		succeeded:   cfg.Succeeded,
		now:         cfg.Now,
		policy:      cfg.Policy,
		environment: cfg.Environment,
		gateway:     cfg.Gateway,
		counter:     cfg.Counter,
		runSteps:    cfg.RunSteps,
	}
	if e.store == nil {
		return nil, fmt.Errorf("engine: a store is required")
	}
	if e.now == nil {
		e.now = time.Now
	}
	switch cfg.Mode {
	case "":
		e.mode = Enforce
		if len(cfg.Manifests) == 0 {
			e.mode, e.autoObserve = Observe, true
		}
	case Enforce, Advise, Observe:
		e.mode = cfg.Mode
	default:
		return nil, fmt.Errorf("engine: mode %q (enforce, advise or observe)", cfg.Mode)
	}
	switch e.reads {
	case "":
		e.reads = ReadsBlock
	case ReadsBlock, ReadsObserve:
	default:
		return nil, fmt.Errorf("engine: unclassified_reads %q (block or observe)", cfg.UnclassifiedReads)
	}
	for _, g := range append(append([]string(nil), e.allow...), e.deny...) {
		if _, err := path.Match(g, ""); err != nil {
			return nil, fmt.Errorf("engine: bad tool-name glob %q: %w", g, err)
		}
	}
	perms := map[string]bool{}
	for i, m := range cfg.Manifests {
		if m == nil {
			return nil, fmt.Errorf("engine: manifest %d is nil", i)
		}
		if _, dup := e.manifests[m.Tool]; dup {
			return nil, fmt.Errorf("engine: two manifests for %s", m.Tool)
		}
		e.manifests[m.Tool] = m
		if m.Permission != "" {
			perms[m.Permission] = true
		}
	}
	if len(cfg.Permissions) > 0 {
		perms = map[string]bool{}
		for _, p := range cfg.Permissions {
			perms[p] = true
		}
	}
	e.scope = perms
	for p := range perms {
		e.scopeList = append(e.scopeList, p)
	}
	sort.Strings(e.scopeList)
	for _, t := range cfg.Tools {
		if _, dup := e.tools[t.Name]; dup {
			return nil, fmt.Errorf("engine: two upstream tools named %s", t.Name)
		}
		ut := &upstreamTool{Tool: t}
		if t.InputSchema != nil {
			ut.input, ut.inputErr = compileSchema(t.Name, "input", t.InputSchema)
			if b, err := CanonicalSchemaJSON(t.InputSchema); err == nil {
				ut.inputHash = fullHash(b)
			}
		}
		if t.OutputSchema != nil {
			ut.output, ut.outputErr = compileSchema(t.Name, "output", t.OutputSchema)
		}
		e.tools[t.Name] = ut
		e.toolOrder = append(e.toolOrder, t.Name)
	}
	sort.Strings(e.toolOrder)
	return e, nil
}

// Mode is the mode the engine runs in (after the automatic choice).
func (e *Engine) Mode() Mode { return e.mode }

// AutoObserve reports whether observe mode was chosen because no manifests loaded and no
// mode was named; the gateway then prints AutoObserveMessage.
func (e *Engine) AutoObserve() bool { return e.autoObserve }

// Manifest returns the manifest for tool, or nil.
func (e *Engine) Manifest(tool string) *manifest.Manifest { return e.manifests[tool] }

// Unmatched returns the tools (sorted) that have a manifest but that no upstream exposes:
// usually a name without its `<upstream>.` prefix, or an upstream that dropped the tool.
func (e *Engine) Unmatched() []string {
	var out []string
	for tool := range e.manifests {
		if _, ok := e.tools[tool]; !ok {
			out = append(out, tool)
		}
	}
	sort.Strings(out)
	return out
}

// Scope returns the session scope (sorted).
func (e *Engine) Scope() []string { return append([]string(nil), e.scopeList...) }

// Listed reports whether tool passes the allow and deny globs, so that `tools/list` shows it.
func (e *Engine) Listed(tool string) bool { _, ok := e.allowDeny(tool); return ok }

// AllowDeny applies the allow/deny globs to name (a tool or prompt name, a resource URI): why
// is the refusal's text when ok is false.
func (e *Engine) AllowDeny(name string) (why string, ok bool) { return e.allowDeny(name) }

// Denied applies the deny globs alone to name: why is the refusal's text when denied is true.
func (e *Engine) Denied(name string) (why string, denied bool) {
	for _, g := range e.deny {
		if ok, _ := path.Match(g, name); ok {
			return fmt.Sprintf("%s is denied by the gateway's deny rule %q", name, g), true
		}
	}
	return "", false
}

// allowDeny returns the violation text of the allow/deny globs, or ok. A name is denied also
// when a part of it before a slash is: path.Match's * stops at a slash, and names are the
// upstream's to choose (deny: ["fs.*"] covers fs.team/secret).
func (e *Engine) allowDeny(tool string) (string, bool) {
	if why, denied := e.Denied(tool); denied {
		return why, false
	}
	for i := 0; i < len(tool); i++ {
		if tool[i] != '/' {
			continue
		}
		if why, denied := e.Denied(tool[:i]); denied {
			return fmt.Sprintf("%s is within %s, and %s", tool, tool[:i], why), false
		}
	}
	if len(e.allow) == 0 {
		return "", true
	}
	for _, g := range e.allow {
		if ok, _ := path.Match(g, tool); ok {
			return "", true
		}
	}
	return fmt.Sprintf("%s is not matched by the gateway's allow rules", tool), false
}

// Holder holds the Engine in use. Load and Swap are atomic: a reload builds a new Engine and
// swaps it in; a call keeps the Engine it loaded until it finishes (seed: Hot reload).
type Holder struct{ p atomic.Pointer[Engine] }

// NewHolder returns a Holder serving e.
func NewHolder(e *Engine) *Holder {
	h := &Holder{}
	h.p.Store(e)
	return h
}

// Load returns the Engine in use.
func (h *Holder) Load() *Engine { return h.p.Load() }

// Swap puts e in use and returns the previous Engine.
func (h *Holder) Swap(e *Engine) *Engine { return h.p.Swap(e) }
