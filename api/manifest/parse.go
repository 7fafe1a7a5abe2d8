package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Document is one object read from a file: a tool manifest (or, for other readers such as
// contract tests, any object), with the line of every field so errors can point at it.
//
// Value holds plain Go values: map[string]any, []any, string, bool, int64, float64 or nil.
type Document struct {
	File  string
	Index int // position in the file, counting objects across YAML documents and arrays (0-based)
	Value any
	lines map[string]int
}

// Line returns the line of the field at path, or of its closest enclosing field when the
// path itself is absent (a missing required field points at its object). 0 when unknown.
func (d *Document) Line(path string) int {
	if d == nil || d.lines == nil {
		return 0
	}
	for {
		if l, ok := d.lines[path]; ok {
			return l
		}
		if path == "" {
			return 0
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			path = ""
		} else {
			path = path[:i]
		}
	}
}

// ManifestExtensions are the file name suffixes read from a folder.
var ManifestExtensions = []string{".json", ".yaml", ".yml"}

// ReadPaths reads every file given, and every *.json, *.yaml and *.yml file under every
// folder given (recursively, in lexical order). It returns the objects found and every
// syntax problem (a *FieldError naming the file and line); a file with a syntax error
// contributes no objects. A path that does not exist is an error too.
func ReadPaths(paths ...string) ([]Document, []error) {
	var docs []Document
	var errs []error
	for _, p := range paths {
		files, err := listFiles(p)
		if err != nil {
			errs = append(errs, &FieldError{File: p, Message: err.Error()})
			continue
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				errs = append(errs, &FieldError{File: f, Message: err.Error()})
				continue
			}
			d, err := ParseFile(f, data)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			docs = append(docs, d...)
		}
	}
	return docs, errs
}

func listFiles(p string) ([]string, error) {
	info, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return []string{p}, nil
	}
	var files []string
	err = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !hasManifestExtension(path) {
			return nil
		}
		files = append(files, path)
		return nil
	})
	sort.Strings(files)
	return files, err
}

func hasManifestExtension(path string) bool {
	ext := strings.ToLower(filepath.Ext(path))
	for _, e := range ManifestExtensions {
		if ext == e {
			return true
		}
	}
	return false
}

// ParseFile parses JSON or YAML (several YAML documents allowed). Each document is an object
// or an array of objects; every object becomes a Document. Duplicate keys, non-string keys and
// non-object entries are errors. JSON files (by extension) must be strict JSON.
//
// The error, if any, is a *FieldError with the file and line.
func ParseFile(file string, data []byte) ([]Document, error) {
	if strings.EqualFold(filepath.Ext(file), ".json") {
		if err := checkJSON(data); err != nil {
			return nil, &FieldError{File: file, Line: jsonLine(data, err), Message: "invalid JSON: " + err.Error()}
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []Document
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, &FieldError{File: file, Line: yamlErrorLine(err), Message: "invalid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}
		}
		root := &n
		if root.Kind == yaml.DocumentNode {
			if len(root.Content) == 0 {
				continue
			}
			root = root.Content[0]
		}
		root = deref(root)
		var objs []*yaml.Node
		switch {
		case root.Kind == yaml.MappingNode:
			objs = []*yaml.Node{root}
		case root.Kind == yaml.SequenceNode:
			for _, c := range root.Content {
				objs = append(objs, deref(c))
			}
		case root.Kind == yaml.ScalarNode && root.Tag == "!!null":
			continue // an empty document, as after a trailing "---"
		default:
			return nil, &FieldError{File: file, Line: root.Line, Message: "expected an object or a list of objects"}
		}
		for _, o := range objs {
			if o.Kind != yaml.MappingNode {
				return nil, &FieldError{File: file, Line: o.Line, Message: fmt.Sprintf("entry %d: expected an object, found %s", len(docs)+1, kindName(o))}
			}
			d := Document{File: file, Index: len(docs), lines: map[string]int{}}
			w := walker{lines: d.lines, budget: maxValuesPerObject}
			v, err := w.toValue(o, "")
			if err != nil {
				return nil, &FieldError{File: file, Line: err.line, Message: err.msg}
			}
			d.Value = v
			docs = append(docs, d)
		}
	}
	return docs, nil
}

type nodeError struct {
	line int
	msg  string
}

func deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "an object"
	default:
		return "a scalar"
	}
}

// maxValuesPerObject bounds the values one object may expand to, so aliases cannot blow up
// ("billion laughs") or loop.
const maxValuesPerObject = 100_000

// maxDepth bounds nesting, which also stops an alias that contains itself.
const maxDepth = 64

// walker converts YAML nodes into plain Go values, recording the line of every path.
type walker struct {
	lines  map[string]int
	budget int
	depth  int
}

func (w *walker) toValue(n *yaml.Node, path string) (any, *nodeError) {
	n = deref(n)
	if w.budget--; w.budget < 0 {
		return nil, &nodeError{n.Line, fmt.Sprintf("%s: too many values (more than %d, aliases included): split the file", orRoot(path), maxValuesPerObject)}
	}
	if w.depth++; w.depth > maxDepth {
		return nil, &nodeError{n.Line, fmt.Sprintf("nested more than %d levels deep (or an alias contains itself): flatten it", maxDepth)}
	}
	defer func() { w.depth-- }()
	lines := w.lines
	lines[path] = n.Line
	switch n.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		first := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := deref(n.Content[i]), n.Content[i+1]
			if k.Kind != yaml.ScalarNode || (k.Tag != "!!str" && k.Tag != "!!int" && k.Tag != "!!bool" && k.Tag != "!!float") {
				if k.Tag == "!!merge" {
					return nil, &nodeError{k.Line, fmt.Sprintf("%s: YAML merge keys (<<) are not supported: write the fields out", orRoot(path))}
				}
				return nil, &nodeError{k.Line, fmt.Sprintf("%s: keys must be plain strings", orRoot(path))}
			}
			if l, dup := first[k.Value]; dup {
				return nil, &nodeError{k.Line, fmt.Sprintf("%s: duplicate key %q (first at line %d): keep one", joinPath(path, k.Value), k.Value, l)}
			}
			first[k.Value] = k.Line
			child := joinPath(path, k.Value)
			cv, err := w.toValue(v, child)
			if err != nil {
				return nil, err
			}
			lines[child] = k.Line
			m[k.Value] = cv
		}
		return m, nil
	case yaml.SequenceNode:
		s := make([]any, 0, len(n.Content))
		for i, c := range n.Content {
			cv, err := w.toValue(c, indexPath(path, i))
			if err != nil {
				return nil, err
			}
			s = append(s, cv)
		}
		return s, nil
	case yaml.ScalarNode:
		var v any
		if err := n.Decode(&v); err != nil {
			return nil, &nodeError{n.Line, fmt.Sprintf("%s: %v", orRoot(path), err)}
		}
		switch x := v.(type) {
		case int:
			return int64(x), nil
		case uint64:
			return float64(x), nil
		}
		return v, nil
	}
	return nil, &nodeError{n.Line, fmt.Sprintf("%s: unsupported YAML node", orRoot(path))}
}

func orRoot(path string) string {
	if path == "" {
		return "(root)"
	}
	return path
}

// checkJSON reports the first syntax error of strict JSON: one value, nothing after it.
// Duplicate keys are left to the YAML walk, which reports each with its line.
func checkJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("unexpected content after the top-level value at byte %d", dec.InputOffset())
	}
	return nil
}

func jsonLine(data []byte, err error) int {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return bytes.Count(data[:min(int(se.Offset), len(data))], []byte("\n")) + 1
	}
	return 0
}

// yamlErrorLine pulls "line N" out of a go-yaml error message; the library has no typed
// position for syntax errors.
func yamlErrorLine(err error) int {
	var te *yaml.TypeError
	msg := err.Error()
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg = te.Errors[0]
	}
	var line int
	if i := strings.Index(msg, "line "); i >= 0 {
		fmt.Sscanf(msg[i+5:], "%d", &line)
	}
	return line
}
