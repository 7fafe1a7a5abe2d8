package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/yosida95/uritemplate/v3"
)

// listPages follows the cursors of one list method of an upstream and returns every item,
// bounded as tools/list is (issue 18): at most limits.pages_per_listing pages, at most max items
// (limitName names the field to raise), at most limits.listing_bytes of items as JSON, no cursor
// twice (ErrCursorCycle), within ListTimeout. noun names the items in errors ("tools"); fetch
// returns one page and its size in bytes (-1: the items are measured as JSON here).
// Errors name the upstream and the method; a limit is a *LimitError.
func listPages[T any](ctx context.Context, up *upstream, method, noun string, max int, limitName string,
	fetch func(ctx context.Context, cursor string) (items []T, next string, size int64, err error)) ([]T, error) {
	ctx, cancel := context.WithTimeout(ctx, ListTimeout)
	defer cancel()
	l := effectiveLimits(up.dial.cfg.Limits)
	var items []T
	var size int64                       // the items' JSON so far
	seen := map[[sha256.Size]byte]bool{} // hashes, not cursors: a cursor can be megabytes
	cursor := ""
	for page := 1; ; page++ {
		got, next, n, err := fetch(ctx, cursor)
		if err != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, fmt.Errorf("upstream %s: %s: no complete listing within %s (at page %d): %w", up.name, method, ListTimeout, page, err)
			}
			return nil, fmt.Errorf("upstream %s: %s: %w", up.name, method, err)
		}
		if n := len(items) + len(got); n > max {
			up.dial.limitHit(limitName)
			return nil, upstreamLimit(up.name, limitName, max,
				fmt.Sprintf("%s offers more than %d %s (%d by page %d)", method, max, noun, n, page))
		}
		// The items as JSON (n, when fetch knows it): pages_per_listing pages of
		// message_bytes each would let one listing hold gigabytes.
		if n < 0 {
			if b, err := json.Marshal(got); err == nil {
				n = int64(len(b))
			}
		}
		size += n
		if size > l.ListingBytes {
			up.dial.limitHit("listing_bytes")
			return nil, upstreamLimit(up.name, "listing_bytes", int(l.ListingBytes),
				fmt.Sprintf("the %s of %s take more than %d bytes (%d by page %d)", noun, method, l.ListingBytes, size, page))
		}
		items = append(items, got...)
		if next == "" {
			return items, nil
		}
		sum := sha256.Sum256([]byte(next))
		if seen[sum] {
			up.dial.limitHit("pages_per_listing")
			return nil, fmt.Errorf("upstream %s: %s page %d: %w", up.name, method, page, ErrCursorCycle)
		}
		seen[sum] = true
		if page >= l.PagesPerListing {
			up.dial.limitHit("pages_per_listing")
			return nil, upstreamLimit(up.name, "pages_per_listing", l.PagesPerListing,
				fmt.Sprintf("%s has more than %d pages", method, l.PagesPerListing))
		}
		cursor = next
	}
}

// caps returns what the upstream of cs declared (never nil).
func caps(cs *mcp.ClientSession) *mcp.ServerCapabilities {
	if r := cs.InitializeResult(); r != nil && r.Capabilities != nil {
		return r.Capabilities
	}
	return &mcp.ServerCapabilities{}
}

// listPrompts lists every prompt of the upstream over cs.
func (up *upstream) listPrompts(ctx context.Context, cs *mcp.ClientSession) ([]*mcp.Prompt, error) {
	l := effectiveLimits(up.dial.cfg.Limits)
	return listPages(ctx, up, "prompts/list", "prompts", l.ToolsPerUpstream, "tools_per_upstream",
		func(ctx context.Context, cursor string) ([]*mcp.Prompt, string, int64, error) {
			res, err := cs.ListPrompts(ctx, &mcp.ListPromptsParams{Cursor: cursor})
			if err != nil {
				return nil, "", 0, err
			}
			return res.Prompts, res.NextCursor, -1, nil
		})
}

// listResources lists every resource of the upstream over cs.
func (up *upstream) listResources(ctx context.Context, cs *mcp.ClientSession) ([]*mcp.Resource, error) {
	l := effectiveLimits(up.dial.cfg.Limits)
	return listPages(ctx, up, "resources/list", "resources", l.ToolsPerUpstream, "tools_per_upstream",
		func(ctx context.Context, cursor string) ([]*mcp.Resource, string, int64, error) {
			res, err := cs.ListResources(ctx, &mcp.ListResourcesParams{Cursor: cursor})
			if err != nil {
				return nil, "", 0, err
			}
			return res.Resources, res.NextCursor, -1, nil
		})
}

// listTemplates lists every resource template of the upstream over cs.
func (up *upstream) listTemplates(ctx context.Context, cs *mcp.ClientSession) ([]*mcp.ResourceTemplate, error) {
	l := effectiveLimits(up.dial.cfg.Limits)
	return listPages(ctx, up, "resources/templates/list", "resource templates", l.ToolsPerUpstream, "tools_per_upstream",
		func(ctx context.Context, cursor string) ([]*mcp.ResourceTemplate, string, int64, error) {
			res, err := cs.ListResourceTemplates(ctx, &mcp.ListResourceTemplatesParams{Cursor: cursor})
			if err != nil {
				return nil, "", 0, err
			}
			return res.ResourceTemplates, res.NextCursor, -1, nil
		})
}

// features is what one upstream offers besides tools, from its last complete listings.
type features struct {
	caps      *mcp.ServerCapabilities
	prompts   []*mcp.Prompt
	resources []*mcp.Resource
	templates []*mcp.ResourceTemplate
}

// listFeatures lists the prompts, resources and templates the upstream declared (over its
// shared session) and keeps them. A failed listing keeps nothing: the previous ones stay.
func (up *upstream) listFeatures(ctx context.Context) error {
	cs, err := up.session()
	if err != nil {
		return err
	}
	f := features{caps: caps(cs)}
	if up.cfg.NoResources && f.caps.Resources != nil { // resources: false
		c := *f.caps
		c.Resources = nil
		f.caps = &c
	}
	if f.caps.Prompts != nil {
		if f.prompts, err = up.listPrompts(ctx, cs); err != nil {
			return err
		}
	}
	if f.caps.Resources != nil {
		if f.resources, err = up.listResources(ctx, cs); err != nil {
			return err
		}
		if f.templates, err = up.listTemplates(ctx, cs); err != nil {
			return err
		}
	}
	up.mu.Lock()
	up.features = f
	up.mu.Unlock()
	return nil
}

// catalog routes prompts and resources to upstreams (issue 19). Prompt names are exposed as
// tool names are (`<upstream>.<prompt>` unless namespace: false); resource URIs and templates
// are kept as the upstream gives them. Two upstreams exposing one prompt name, one URI or one
// template is an error (at start, as for tools; on a later change the previous catalog stays).
type catalog struct {
	prompts   map[string]promptRoute // by exposed name
	resources map[string]*upstream   // by URI
	templates []templateRoute
	// Upstreams that declared each capability, in config order.
	withPrompts, withResources, withCompletions, withLogging []*upstream
}

type promptRoute struct {
	up   *upstream
	name string // on the upstream
}

type templateRoute struct {
	up *upstream
	t  *uritemplate.Template
}

// buildCatalog builds the catalog of the upstreams' last listings. Errors name both upstreams
// and what clashes.
func buildCatalog(ups []*upstream) (*catalog, error) {
	c := &catalog{prompts: map[string]promptRoute{}, resources: map[string]*upstream{}}
	templates := map[string]*upstream{}
	var errs []error
	for _, up := range ups {
		up.mu.Lock()
		f := up.features
		up.mu.Unlock()
		if f.caps == nil {
			continue
		}
		if f.caps.Prompts != nil {
			c.withPrompts = append(c.withPrompts, up)
		}
		if f.caps.Resources != nil {
			c.withResources = append(c.withResources, up)
		}
		if f.caps.Completions != nil {
			c.withCompletions = append(c.withCompletions, up)
		}
		if f.caps.Logging != nil {
			c.withLogging = append(c.withLogging, up)
		}
		for _, p := range f.prompts {
			name := exposedName(up.cfg, p.Name)
			if prev, dup := c.prompts[name]; dup && prev.up != up {
				errs = append(errs, fmt.Errorf("prompt name clash: %s is exposed by upstreams %s and %s; set namespace: true on one of them", name, prev.up.name, up.name))
				continue
			}
			c.prompts[name] = promptRoute{up: up, name: p.Name}
		}
		for _, r := range f.resources {
			if prev, dup := c.resources[r.URI]; dup && prev != up {
				errs = append(errs, fmt.Errorf("resource URI clash: %s is listed by upstreams %s and %s; the gateway keeps URIs as they are: set resources: false on one of them (or front them with two gateways)", r.URI, prev.name, up.name))
				continue
			}
			c.resources[r.URI] = up
		}
		for _, rt := range f.templates {
			if prev, dup := templates[rt.URITemplate]; dup && prev != up {
				errs = append(errs, fmt.Errorf("resource template clash: %s is listed by upstreams %s and %s", rt.URITemplate, prev.name, up.name))
				continue
			}
			t, err := uritemplate.New(rt.URITemplate)
			if err != nil {
				errs = append(errs, fmt.Errorf("upstream %s: resource template %q: %w", up.name, rt.URITemplate, err))
				continue
			}
			templates[rt.URITemplate] = up
			c.templates = append(c.templates, templateRoute{up: up, t: t})
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}

// ErrNoRoute is returned (wrapped) for a prompt or resource no upstream serves.
var ErrNoRoute = errors.New("no upstream serves it")

// resourceRoute returns the upstream serving uri: the one that listed it, else the one whose
// template matches it, else the only upstream with resources. More than one template match of
// different upstreams is ambiguous: an error, never a guess.
func (c *catalog) resourceRoute(uri string) (*upstream, error) {
	if up, ok := c.resources[uri]; ok {
		return up, nil
	}
	var match *upstream
	for _, tr := range c.templates {
		if tr.t.Match(uri) == nil {
			continue
		}
		if match != nil && match != tr.up {
			return nil, fmt.Errorf("resource %s matches templates of upstreams %s and %s", uri, match.name, tr.up.name)
		}
		match = tr.up
	}
	if match != nil {
		return match, nil
	}
	if len(c.withResources) == 1 {
		return c.withResources[0], nil
	}
	return nil, fmt.Errorf("resource %s: %w (it is in no upstream's resources/list and matches no template)", uri, ErrNoRoute)
}

// promptRoute returns the upstream and its own name of an exposed prompt name.
func (c *catalog) promptRoute(name string) (promptRoute, error) {
	if r, ok := c.prompts[name]; ok {
		return r, nil
	}
	return promptRoute{}, fmt.Errorf("prompt %s: %w", name, ErrNoRoute)
}

// exposedPrompt is p as the gateway lists it.
func exposedPrompt(up *upstream, p *mcp.Prompt) *mcp.Prompt {
	c := *p
	c.Name = exposedName(up.cfg, p.Name)
	return &c
}

// catalog returns the catalog in use.
func (g *Gateway) catalog() *catalog { return g.cat.Load() }

// serverCapabilities is what the gateway declares to agents: tools always (they come and go
// with the upstreams), and the union of the upstreams' prompts, resources (subscribe when any
// upstream offers it), completions and logging. List changes are always announced: the
// gateway's lists change with any upstream's.
func serverCapabilities(c *catalog) *mcp.ServerCapabilities {
	out := &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}}
	if len(c.withPrompts) > 0 {
		out.Prompts = &mcp.PromptCapabilities{ListChanged: true}
	}
	for _, up := range c.withResources {
		if out.Resources == nil {
			out.Resources = &mcp.ResourceCapabilities{ListChanged: true}
		}
		up.mu.Lock()
		if r := up.features.caps.Resources; r != nil && r.Subscribe {
			out.Resources.Subscribe = true
		}
		up.mu.Unlock()
	}
	if len(c.withCompletions) > 0 {
		out.Completions = &mcp.CompletionCapabilities{}
	}
	if len(c.withLogging) > 0 {
		out.Logging = &mcp.LoggingCapabilities{}
	}
	return out
}

// refreshFeatures lists up's prompts and resources again and, when they changed, swaps the
// catalog and tells every agent (notifications/prompts/list_changed,
// notifications/resources/list_changed). A failed listing or a clash keeps the catalog in use
// and is noted.
func (g *Gateway) refreshFeatures(ctx context.Context, up *upstream) {
	up.mu.Lock()
	old := up.features
	up.mu.Unlock()
	if old.caps == nil || old.caps.Prompts == nil && old.caps.Resources == nil {
		return
	}
	if err := up.listFeatures(ctx); err != nil {
		g.stateMu.Lock()
		g.noteListing(fmt.Sprintf("the prompts and resources were not refreshed: %v", err))
		g.stateMu.Unlock()
		return
	}
	g.stateMu.Lock()
	cat, err := buildCatalog(g.upstreams)
	if err != nil {
		up.mu.Lock()
		up.features = old
		up.mu.Unlock()
		g.noteListing(fmt.Sprintf("the new prompts and resources were refused, the previous ones keep serving: %v", err))
		g.stateMu.Unlock()
		return
	}
	g.cat.Store(cat)
	g.stateMu.Unlock()
	up.mu.Lock()
	now := up.features
	up.mu.Unlock()
	var changed []string
	if !reflect.DeepEqual(old.prompts, now.prompts) {
		changed = append(changed, "notifications/prompts/list_changed")
	}
	if !reflect.DeepEqual(old.resources, now.resources) || !reflect.DeepEqual(old.templates, now.templates) {
		changed = append(changed, "notifications/resources/list_changed")
	}
	for _, method := range changed {
		for _, a := range g.agentList() {
			var p mcp.Params = &mcp.ResourceListChangedParams{}
			if method == "notifications/prompts/list_changed" {
				p = &mcp.PromptListChangedParams{}
			}
			_ = notify(ctx, a.ss, method, p)
		}
	}
}
