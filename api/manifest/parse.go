package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
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

// MaxFileBytes is the largest manifest file read (16 MiB): a bigger one is refused unread, so
// a repository cannot make a reader hold an arbitrarily large file.
const MaxFileBytes = 16 << 20

// ManifestExtensions are the file name suffixes read from a folder.
var ManifestExtensions = []string{".json", ".yaml", ".yml"}

// ReadPaths reads every file given, and every *.json, *.yaml and *.yml file under every
// folder given (recursively, in lexical order, each file once). Hidden entries (names starting
// with ".", such as .git or a ConfigMap volume's ..data) are skipped, symlinked files are read,
// symlinked folders inside a folder are not followed (no loops), and only regular files are
// read (a FIFO would block). It returns the objects found and every problem (a *FieldError
// naming the file and line): an unreadable file or folder is reported and the walk goes on.
func ReadPaths(paths ...string) ([]Document, []error) {
	var docs []Document
	var errs []error
	seen := map[string]bool{}
	for _, p := range paths {
		files, ferrs := listFiles(p)
		errs = append(errs, ferrs...)
		for _, f := range files {
			key := f // the same file through another path or link is read once
			if real, err := filepath.EvalSymlinks(f); err == nil {
				key, _ = filepath.Abs(real)
			}
			if seen[key] {
				continue
			}
			seen[key] = true
			if fi, err := os.Stat(f); err == nil && fi.Size() > MaxFileBytes {
				errs = append(errs, &FieldError{File: f, Message: fmt.Sprintf("%d bytes, more than %d: split it into several files", fi.Size(), MaxFileBytes)})
				continue
			}
			data, err := os.ReadFile(f)
			if err != nil {
				errs = append(errs, &FieldError{File: f, Message: err.Error()})
				continue
			}
			d, perrs := ParseFile(f, data)
			errs = append(errs, perrs...)
			docs = append(docs, d...)
		}
	}
	return docs, errs
}

func listFiles(p string) ([]string, []error) {
	info, err := os.Stat(p) // follows a symlink given on the command line
	if err != nil {
		return nil, []error{&FieldError{File: p, Message: err.Error()}}
	}
	if !info.IsDir() {
		if !info.Mode().IsRegular() {
			return nil, []error{&FieldError{File: p, Message: "not a regular file"}}
		}
		return []string{p}, nil
	}
	root := p
	if resolved, err := filepath.EvalSymlinks(p); err == nil {
		root = resolved
	}
	var files []string
	var errs []error
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		shown := filepath.Join(p, strings.TrimPrefix(path, root))
		if err != nil {
			errs = append(errs, &FieldError{File: shown, Message: err.Error()})
			return nil // WalkDir skips what it cannot read; keep walking the rest
		}
		if path != root && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() || !hasManifestExtension(path) {
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 {
			fi, err := os.Stat(path)
			if err != nil {
				errs = append(errs, &FieldError{File: shown, Message: err.Error()})
				return nil
			}
			if !fi.Mode().IsRegular() {
				return nil // a symlinked folder is not followed
			}
		} else if !d.Type().IsRegular() {
			return nil
		}
		files = append(files, shown)
		return nil
	})
	sort.Strings(files)
	return files, errs
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

// utf8BOM is stripped from the start of a file: editors on some systems write it.
var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// ParseFile parses one file: JSON (by extension, with encoding/json) or YAML (several
// documents allowed, with go-yaml). Each document is an object or a list of objects; every
// object becomes a Document. Every problem is returned (each a *FieldError with the file and
// line): duplicate keys, non-string keys, non-object entries, values that are not JSON (NaN,
// infinities). An object with a problem is still returned without the offending key, so its
// other fields are checked too; a syntax error ends the file.
func ParseFile(file string, data []byte) ([]Document, []error) {
	data = bytes.TrimPrefix(data, utf8BOM)
	// Without aliases a value takes at least a byte, so this bounds alias expansion
	// ("billion laughs") to the size of the file.
	budget := len(data) + 1024
	if strings.EqualFold(filepath.Ext(file), ".json") {
		return parseJSON(file, data, budget)
	}
	return parseYAML(file, data, budget)
}

// objectCollector turns top-level values into Documents and names each problem after the
// tool of the object it is in.
type objectCollector struct {
	file string
	docs []Document
	errs []error
}

func (c *objectCollector) add(v any, line int, lines map[string]int, problems []nodeError) {
	d := Document{File: c.file, Index: len(c.docs), Value: v, lines: lines}
	label := fmt.Sprintf("manifest #%d", d.Index+1)
	if m, ok := v.(map[string]any); ok {
		if t, ok := m["tool"].(string); ok && t != "" {
			label = t
		}
	}
	for _, p := range problems {
		c.errs = append(c.errs, &FieldError{File: c.file, Line: p.line, Tool: label, Path: p.path, Message: p.msg})
	}
	if _, ok := v.(map[string]any); !ok {
		c.errs = append(c.errs, &FieldError{File: c.file, Line: line, Message: fmt.Sprintf("entry %d: expected an object, found %s", d.Index+1, Describe(v))})
		return
	}
	c.docs = append(c.docs, d)
}

func parseYAML(file string, data []byte, budget int) ([]Document, []error) {
	c := &objectCollector{file: file}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	w := &walker{budget: budget}
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			c.errs = append(c.errs, &FieldError{File: file, Line: yamlErrorLine(err), Message: "invalid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")})
			break
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
		case root.Kind == yaml.SequenceNode:
			objs = root.Content
		case root.Kind == yaml.ScalarNode && root.Tag == "!!null":
			continue // an empty document, as after a trailing "---"
		case root.Kind == yaml.MappingNode:
			objs = []*yaml.Node{root}
		default:
			c.errs = append(c.errs, &FieldError{File: file, Line: root.Line, Message: "expected an object or a list of objects"})
			continue
		}
		for _, o := range objs {
			w.lines, w.problems = map[string]int{}, nil
			v, fatal := w.toValue(o, "")
			if fatal != nil {
				c.errs = append(c.errs, &FieldError{File: file, Line: fatal.line, Path: fatal.path, Message: fatal.msg})
				return c.docs, c.errs
			}
			c.add(v, deref(o).Line, w.lines, w.problems)
		}
	}
	return c.docs, c.errs
}

// nodeError is one problem at a path; fatal ones (limits) end the file.
type nodeError struct {
	line int
	path string
	msg  string
}

func deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// maxDepth bounds nesting, which also stops an alias that contains itself.
const maxDepth = 64

// walker converts YAML nodes into plain Go values, recording the line of every path and every
// problem. budget is the number of values left for the whole file.
type walker struct {
	lines    map[string]int
	problems []nodeError
	budget   int
	depth    int
}

func (w *walker) problem(line int, path, format string, args ...any) {
	w.problems = append(w.problems, nodeError{line, path, fmt.Sprintf(format, args...)})
}

func (w *walker) toValue(n *yaml.Node, path string) (any, *nodeError) {
	n = deref(n)
	if w.budget--; w.budget < 0 {
		return nil, &nodeError{n.Line, path, "too many values for the size of the file (YAML aliases expand to more than the file holds): write the values out"}
	}
	if w.depth++; w.depth > maxDepth {
		return nil, &nodeError{n.Line, path, fmt.Sprintf("nested more than %d levels deep (or an alias contains itself): flatten it", maxDepth)}
	}
	defer func() { w.depth-- }()
	w.lines[path] = n.Line
	switch n.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		first := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := deref(n.Content[i]), n.Content[i+1]
			if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" || k.Tag == "!!null" {
				if k.Tag == "!!merge" {
					w.problem(k.Line, path, "YAML merge keys (<<) are not supported: write the fields out")
				} else {
					w.problem(k.Line, path, "keys must be plain strings")
				}
				continue
			}
			child := joinPath(path, k.Value)
			if l, dup := first[k.Value]; dup {
				w.problem(k.Line, child, "duplicate key %q (first at line %d): keep one", k.Value, l)
				continue
			}
			first[k.Value] = k.Line
			cv, fatal := w.toValue(v, child)
			if fatal != nil {
				return nil, fatal
			}
			w.lines[child] = k.Line
			m[k.Value] = cv
		}
		return m, nil
	case yaml.SequenceNode:
		s := make([]any, 0, len(n.Content))
		for i, c := range n.Content {
			cv, fatal := w.toValue(c, indexPath(path, i))
			if fatal != nil {
				return nil, fatal
			}
			s = append(s, cv)
		}
		return s, nil
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!str", "!!timestamp", "!!binary":
			return n.Value, nil // a date stays the text written, as JSON would carry it
		case "!!float":
			f, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64)
			if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
				w.problem(n.Line, path, "%s is not a JSON number: use a finite number", n.Value)
				return nil, nil
			}
		}
		var v any
		if err := n.Decode(&v); err != nil {
			w.problem(n.Line, path, "%v", err)
			return nil, nil
		}
		switch x := v.(type) {
		case int:
			return int64(x), nil
		case uint64:
			return float64(x), nil
		case float64:
			if math.IsNaN(x) || math.IsInf(x, 0) {
				w.problem(n.Line, path, "%s is not a JSON number: use a finite number", n.Value)
				return nil, nil
			}
		}
		return v, nil
	}
	return nil, &nodeError{n.Line, path, "unsupported YAML node"}
}

// parseJSON reads strict JSON with encoding/json's tokenizer, keeping the line of every path
// and reporting duplicate keys (which encoding/json would silently merge).
func parseJSON(file string, data []byte, budget int) ([]Document, []error) {
	c := &objectCollector{file: file}
	newlines := []int{}
	for i, b := range data {
		if b == '\n' {
			newlines = append(newlines, i)
		}
	}
	lineAt := func(off int64) int { return sort.SearchInts(newlines, int(off)) + 1 }
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	j := &jsonWalker{dec: dec, lineAt: lineAt, budget: budget}
	fail := func(err error) ([]Document, []error) {
		line := lineAt(dec.InputOffset())
		var se *json.SyntaxError
		if errors.As(err, &se) {
			line = lineAt(se.Offset)
		}
		msg := err.Error()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			msg = "unexpected end of file"
		}
		c.errs = append(c.errs, &FieldError{File: file, Line: line, Message: "invalid JSON: " + msg})
		return c.docs, c.errs
	}
	tok, err := dec.Token()
	if err != nil {
		return fail(err)
	}
	top := func(t json.Token) error {
		j.lines, j.problems = map[string]int{}, nil
		line := lineAt(dec.InputOffset())
		v, err := j.value(t, "")
		if err != nil {
			return err
		}
		c.add(v, line, j.lines, j.problems)
		return nil
	}
	if d, ok := tok.(json.Delim); ok && d == '[' {
		for dec.More() {
			t, err := dec.Token()
			if err != nil {
				return fail(err)
			}
			if err := top(t); err != nil {
				return fail(err)
			}
		}
		if _, err := dec.Token(); err != nil {
			return fail(err)
		}
	} else if err := top(tok); err != nil {
		return fail(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fail(errors.New("unexpected content after the top-level value"))
	}
	return c.docs, c.errs
}

type jsonWalker struct {
	dec      *json.Decoder
	lineAt   func(int64) int
	lines    map[string]int
	problems []nodeError
	budget   int
	depth    int
}

// value builds the value that starts with token t.
func (j *jsonWalker) value(t json.Token, path string) (any, error) {
	if j.budget--; j.budget < 0 {
		return nil, errors.New("too many values")
	}
	line := j.lineAt(j.dec.InputOffset())
	if _, seen := j.lines[path]; !seen {
		j.lines[path] = line
	}
	switch x := t.(type) {
	case json.Delim:
		if j.depth++; j.depth > maxDepth {
			return nil, fmt.Errorf("nested more than %d levels deep: flatten it", maxDepth)
		}
		defer func() { j.depth-- }()
		if x == '[' {
			s := []any{}
			for i := 0; j.dec.More(); i++ {
				t, err := j.dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := j.value(t, indexPath(path, i))
				if err != nil {
					return nil, err
				}
				s = append(s, v)
			}
			_, err := j.dec.Token()
			return s, err
		}
		m := map[string]any{}
		first := map[string]int{}
		for j.dec.More() {
			kt, err := j.dec.Token()
			if err != nil {
				return nil, err
			}
			k := kt.(string)
			kline := j.lineAt(j.dec.InputOffset())
			child := joinPath(path, k)
			vt, err := j.dec.Token()
			if err != nil {
				return nil, err
			}
			if l, dup := first[k]; dup {
				j.problems = append(j.problems, nodeError{kline, child, fmt.Sprintf("duplicate key %q (first at line %d): keep one", k, l)})
				kept := j.lines
				j.lines = map[string]int{} // consume the duplicate's value without recording it
				_, err := j.value(vt, child)
				j.lines = kept
				if err != nil {
					return nil, err
				}
				continue
			}
			first[k] = kline
			j.lines[child] = kline
			v, err := j.value(vt, child)
			if err != nil {
				return nil, err
			}
			m[k] = v
		}
		_, err := j.dec.Token()
		return m, err
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i, nil
		}
		f, err := x.Float64()
		if err != nil || math.IsInf(f, 0) {
			j.problems = append(j.problems, nodeError{line, path, fmt.Sprintf("%s is not a finite number", x)})
			return nil, nil
		}
		return f, nil
	}
	return t, nil // string, bool or nil
}

// yamlErrorLine pulls "line N" out of a go-yaml error message; the library has no typed
// position for syntax errors.
func yamlErrorLine(err error) int {
	var line int
	if i := strings.Index(err.Error(), "line "); i >= 0 {
		fmt.Sscanf(err.Error()[i+5:], "%d", &line)
	}
	return line
}

// ReadFS reads every *.json, *.yaml and *.yml file under dir in fsys (recursively, in
// lexical order; hidden entries skipped), as ReadPaths does for a folder on disk. Files are
// named prefix + their path in messages. A symbolic link is an error, never followed: fsys may
// hold another party's files (a git commit).
func ReadFS(fsys fs.FS, dir, prefix string) ([]Document, []error) {
	return ReadFSSkipping(fsys, dir, prefix, "")
}

// ReadFSSkipping is ReadFS that leaves out the folder skip (a path in fsys, "" for none): a
// Plain ManifestRegistry's `policy/` folder holds policies, not manifests.
func ReadFSSkipping(fsys fs.FS, dir, prefix, skip string) ([]Document, []error) {
	var docs []Document
	var errs []error
	_ = fs.WalkDir(fsys, dir, func(p string, d fs.DirEntry, err error) error {
		shown := prefix + p
		if skip != "" && p == skip && d != nil && d.IsDir() {
			return fs.SkipDir
		}
		if err != nil {
			errs = append(errs, &FieldError{File: shown, Message: err.Error()})
			return nil
		}
		if p != dir && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.IsDir() || !hasManifestExtension(p) {
			return nil
		}
		if !d.Type().IsRegular() {
			errs = append(errs, &FieldError{File: shown, Message: "a link is not read: replace it with the file"})
			return nil
		}
		if info, err := d.Info(); err == nil && info.Size() > MaxFileBytes {
			errs = append(errs, &FieldError{File: shown, Message: fmt.Sprintf("%d bytes, more than %d: split it into several files", info.Size(), MaxFileBytes)})
			return nil
		}
		data, err := fs.ReadFile(fsys, p)
		if err != nil {
			errs = append(errs, &FieldError{File: shown, Message: err.Error()})
			return nil
		}
		d2, perrs := ParseFile(shown, data)
		docs = append(docs, d2...)
		errs = append(errs, perrs...)
		return nil
	})
	return docs, errs
}
