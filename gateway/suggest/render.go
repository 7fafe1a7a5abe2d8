package suggest

import (
	"bytes"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// render writes p as a YAML manifest with comments (yaml.v3 nodes, so the comments sit on the
// fields they are about) and returns it with the guesses it states.
func render(p *plan) ([]byte, []string) {
	t := p.tool.Tool
	var guesses []string
	top := []string{
		"Draft by reversi suggest-manifest: the server's annotations are its own claims, so this grants",
		"nothing until a person reviews every guess below and approves it in a registry.",
		fmt.Sprintf("confidence: %s%s", p.confidence, confidenceReason(p)),
	}
	root := &yaml.Node{Kind: yaml.MappingNode}
	add := func(key string, value *yaml.Node, head string) {
		k := scalar(key)
		k.HeadComment = head
		root.Content = append(root.Content, k, value)
	}
	add("tool", scalar(t.Name), "")
	add("status", scalar(string(manifest.Draft)), "")
	if p.description != "" {
		add("description", scalar(p.description), "")
	} else {
		guesses = append(guesses, "TODO: the server gives no description: say what the tool changes")
		top = append(top, guesses[len(guesses)-1])
	}

	effect := scalar(string(p.effect))
	g := "effect guessed: " + p.effectWhy
	effect.LineComment = "guessed: " + p.effectWhy
	guesses = append(guesses, g)
	add("effect", effect, "")

	perm := scalar(p.permission)
	perm.LineComment = p.permWhy
	guesses = append(guesses, "permission "+p.permWhy)
	add("permission", perm, "")

	if p.effect == manifest.Irreversible {
		a := scalar("always")
		a.LineComment = "irreversible tools always need approval; add roles and a quorum"
		add("approval", a, "")
	}
	if c := p.comp; c != nil {
		add("compensation", compensationNode(c, &guesses), "")
	}
	if p.effect.Mutating() {
		todo := "TODO: owner (or oncall), risk.data_class and timeout_ms: nobody can guess them from the server"
		top = append(top, todo)
	}
	h := scalar(p.hash)
	h.LineComment = "SchemaHash of the input schema when drafted: a change blocks calls until reviewed"
	add("schema_hash", h, "")

	doc := &yaml.Node{Kind: yaml.DocumentNode, HeadComment: strings.Join(top, "\n"), Content: []*yaml.Node{root}}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		panic("suggest: encoding a draft: " + err.Error()) // only plain strings go in
	}
	_ = enc.Close()
	return buf.Bytes(), guesses
}

func compensationNode(c *compPlan, guesses *[]string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.MappingNode}
	add := func(key string, value *yaml.Node, head string) {
		k := scalar(key)
		k.HeadComment = head
		n.Content = append(n.Content, k, value)
	}
	*guesses = append(*guesses, "compensation guessed: "+c.why)
	var notes []string
	notes = append(notes, c.mapWhy...)
	notes = append(notes, c.todo...)
	if len(c.argMap) == 0 && len(c.todo) == 0 {
		notes = append(notes, fmt.Sprintf("TODO: argument_map: nothing of this call matches %s's arguments; map them", c.tool))
	}
	*guesses = append(*guesses, notes...)
	toolHead := []string{"guessed: " + c.why}
	if len(c.argMap) == 0 {
		toolHead = append(toolHead, notes...)
	}
	add("tool", scalar(c.tool), strings.Join(toolHead, "\n"))
	add("kind", scalar(c.kind), "")
	if len(c.residue) > 0 {
		seq := &yaml.Node{Kind: yaml.SequenceNode}
		for _, r := range c.residue {
			seq.Content = append(seq.Content, scalar(r))
		}
		add("residue", seq, "")
	}
	if len(c.argMap) > 0 {
		m := &yaml.Node{Kind: yaml.MappingNode}
		for _, k := range sortedKeys(c.argMap) {
			m.Content = append(m.Content, scalar(k), scalar(c.argMap[k]))
		}
		add("argument_map", m, strings.Join(append([]string{"guessed: check every reference"}, notes...), "\n"))
	}
	return n
}

func confidenceReason(p *plan) string {
	if len(p.confWhy) == 0 {
		switch p.confidence {
		case High:
			return " (the server declares the effect and the undo)"
		case Medium:
			return " (the effect is the server's annotations, and the name agrees)"
		}
		return ""
	}
	return " (" + strings.Join(p.confWhy, "; ") + ")"
}

func scalar(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
}
