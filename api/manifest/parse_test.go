package manifest

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
)

func writeFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadPathsFolderRecursiveAllFormats(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "a.json", `{"tool":"a.read","effect":"read_only","permission":"a:read"}`)
	writeFile(t, dir, "sub/b.yaml", "tool: b.read\neffect: read_only\npermission: b:read\n---\n- tool: c.read\n  effect: read_only\n  permission: c:read\n- tool: d.read\n  effect: read_only\n  permission: d:read\n---\n")
	writeFile(t, dir, "sub/deeper/e.yml", "[{tool: e.read, effect: read_only, permission: e:read}]")
	writeFile(t, dir, "notes.txt", "not a manifest")
	docs, errs := ReadPaths(dir)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	ms, errs := ValidateDocuments(docs)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	var names []string
	for _, m := range ms {
		names = append(names, m.Tool)
	}
	if got := strings.Join(names, ","); got != "a.read,b.read,c.read,d.read,e.read" {
		t.Fatalf("tools = %s", got)
	}
	if docs[3].Index != 2 || docs[3].File != filepath.Join(dir, "sub/b.yaml") {
		t.Fatalf("doc 3 = %s #%d", docs[3].File, docs[3].Index)
	}
}

func TestParseFileErrorsNameFileAndLine(t *testing.T) {
	cases := []struct {
		name, file, body string
		line             int
		want             string
	}{
		{"yaml duplicate key", "m.yaml", "tool: a\neffect: read_only\ntool: b\n", 3, `tool: duplicate key "tool" (first at line 1): keep one`},
		{"json duplicate key", "m.json", "{\n \"tool\": \"a\",\n \"tool\": \"b\"\n}", 3, `duplicate key "tool" (first at line 2)`},
		{"nested duplicate key", "m.yaml", "tool: a\nrisk:\n  data_class: x\n  data_class: y\n", 4, `risk.data_class: duplicate key`},
		{"json syntax", "m.json", "{\n \"tool\": \"a\",\n}", 3, "invalid JSON"},
		{"json trailing content", "m.json", `{"tool":"a"} {"tool":"b"}`, 0, "unexpected content after the top-level value"},
		{"yaml syntax", "m.yaml", "tool: a\n  effect: [\n", 2, "invalid YAML"},
		{"scalar document", "m.yaml", "just text\n", 1, "expected an object or a list of objects"},
		{"list of scalars", "m.yaml", "- tool: a\n- 3\n", 2, "entry 2: expected an object, found number 3"},
		{"merge key", "m.yaml", "base: &b {effect: read_only}\nx:\n  <<: *b\n", 3, "merge keys"},
		{"non-string key", "m.yaml", "? [a, b]\n: 1\n", 1, "keys must be plain strings"},
		{"alias containing itself", "m.yaml", "a: &a [*a]\n", 1, "an alias contains itself"},
		{"alias bomb", "m.yaml", aliasBomb, 0, "too many values"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, errs := ParseFile(c.file, []byte(c.body))
			if len(errs) != 1 {
				t.Fatalf("errors %v, want one", errs)
			}
			fe, ok := errs[0].(*FieldError)
			if !ok {
				t.Fatalf("error %T %v", errs[0], errs[0])
			}
			if fe.File != c.file || (c.line > 0 && fe.Line != c.line) || !strings.Contains(fe.Error(), c.want) {
				t.Fatalf("got %q (file %s line %d), want line %d containing %q", fe.Error(), fe.File, fe.Line, c.line, c.want)
			}
		})
	}
}

func TestReadPathsMissingPath(t *testing.T) {
	_, errs := ReadPaths(filepath.Join(t.TempDir(), "nope"))
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "no such file") {
		t.Fatalf("errs = %v", errs)
	}
}

func TestReadPathsReportsEveryBadFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "a.yaml", "tool: a\ntool: b\n")
	writeFile(t, dir, "b.json", "{")
	writeFile(t, dir, "c.yaml", "tool: c.read\neffect: read_only\npermission: c:read\n")
	docs, errs := ReadPaths(dir)
	// a.yaml's object is kept (without its duplicate key); b.json is cut short.
	if len(errs) != 2 || len(docs) != 2 {
		t.Fatalf("docs %d errs %v", len(docs), errs)
	}
}

func TestErrorsCarryLineOfField(t *testing.T) {
	body := "- tool: a.write\n  effect: compensable\n  permission: a:write\n  compensation:\n    tool: a.undo\n    argument_map:\n      id: result.id\n"
	docs, err := ParseFile("f.yaml", []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	_, errs := ValidateDocuments(docs)
	var found bool
	for _, e := range errs {
		fe := e.(*FieldError)
		if fe.Path == "compensation.argument_map.id" {
			found = true
			if fe.Line != 7 || fe.File != "f.yaml" || fe.Tool != "a.write" {
				t.Fatalf("got %v", fe)
			}
			want := `f.yaml:7: a.write: compensation.argument_map.id: "result.id" is not a reference`
			if !strings.HasPrefix(fe.Error(), want) {
				t.Fatalf("Error() = %q, want prefix %q", fe.Error(), want)
			}
		}
	}
	if !found {
		t.Fatalf("no error for the bad reference: %v", errs)
	}
}

func TestLineFallsBackToEnclosingObject(t *testing.T) {
	docs, err := ParseFile("f.yaml", []byte("- tool: x\n- tool: a.write\n  compensation:\n    kind: inverse\n"))
	if err != nil {
		t.Fatal(err)
	}
	d := docs[1]
	if got := d.Line("compensation.tool"); got != 3 {
		t.Fatalf("line of missing compensation.tool = %d, want 3 (its object)", got)
	}
	if got := d.Line("effect"); got != 2 {
		t.Fatalf("line of missing effect = %d, want 2 (the manifest)", got)
	}
}

// aliasBomb expands to 9^7 values through aliases ("billion laughs").
var aliasBomb = func() string {
	var b strings.Builder
	b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i <= 6; i++ {
		fmt.Fprintf(&b, "a%d: &a%d [", i, i)
		for j := 0; j < 9; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "*a%d", i-1)
		}
		b.WriteString("]\n")
	}
	return b.String()
}()

// Repeating an alias of a large value many times is bounded by the file's size, not per object.
func TestRepeatedAliasIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("- &a {tool: x, effect: read_only, permission: p, description: [")
	for i := 0; i < 1000; i++ {
		b.WriteString("v, ")
	}
	b.WriteString("v]}\n")
	for i := 0; i < 100_000; i++ {
		b.WriteString("- *a\n")
	}
	docs, errs := ParseFile("m.yaml", []byte(b.String()))
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "too many values for the size of the file") {
		t.Fatalf("%d docs, errs %v", len(docs), errs)
	}
}

func TestJSONIsReadWithAJSONParser(t *testing.T) {
	long := strings.Repeat("k", 2000)
	body := "\xEF\xBB\xBF" + `{"tool": "a.read", "effect": "read_only", "permission": "a:read",
 "description": "a\/b \u00e9 \ud800", "schema_hash": "` + long + `"}`
	docs, errs := ParseFile("m.json", []byte(body))
	if len(errs) > 0 || len(docs) != 1 {
		t.Fatalf("valid JSON refused: %v", errs)
	}
	if d := docs[0].Value.(map[string]any)["description"]; d != "a/b é \uFFFD" {
		t.Fatalf("description %q", d)
	}
	if docs[0].Line("schema_hash") != 2 {
		t.Fatalf("line of schema_hash = %d", docs[0].Line("schema_hash"))
	}
	for body, want := range map[string]string{
		"":                     "m.json:1: invalid JSON: unexpected end of file",
		"{\n\"a\": 1e400}":     `m.json:2: manifest #1: a: 1e400 is not a finite number`,
		"[{\"tool\": 1},\n 2]": "m.json:2: entry 2: expected an object, found number 2",
	} {
		_, errs := ParseFile("m.json", []byte(body))
		if len(errs) == 0 || errs[len(errs)-1].Error() != want {
			t.Errorf("%q: errs %v, want %q", body, errs, want)
		}
	}
}

func TestYAMLScalarsStayJSONValues(t *testing.T) {
	docs, errs := ParseFile("m.yaml", []byte("on: 2024-01-01\nbig: 0x10\nok: yes\n"))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	v := docs[0].Value.(map[string]any)
	if v["on"] != "2024-01-01" || v["big"] != int64(16) {
		t.Fatalf("values %#v", v)
	}
	for _, bad := range []string{"x: .nan\n", "x: -.inf\n"} {
		if _, errs := ParseFile("m.yaml", []byte(bad)); len(errs) != 1 || !strings.Contains(errs[0].Error(), "is not a JSON number") {
			t.Errorf("%q: %v", bad, errs)
		}
	}
}

// Folders: hidden entries skipped (a ConfigMap volume's ..data links), a symlinked root
// followed, symlinked files read, FIFOs and symlinked sub-folders skipped, unreadable
// entries reported without stopping the walk, and each file read once.
func TestFolderWalk(t *testing.T) {
	dir := t.TempDir()
	good := "{tool: %s, effect: read_only, permission: p}\n"
	writeFile(t, dir, "cm/..2024_01_01/a.yaml", fmt.Sprintf(good, "a"))
	if err := os.Symlink("..2024_01_01", filepath.Join(dir, "cm/..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/a.yaml", filepath.Join(dir, "cm/a.yaml")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "cm/.git/x.yaml", "not: a manifest\n")
	if err := syscall.Mkfifo(filepath.Join(dir, "cm/pipe.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "cm"), filepath.Join(dir, "cm/loop")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "cm"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	docs, errs := ReadPaths(filepath.Join(dir, "link"), filepath.Join(dir, "cm", "a.yaml"))
	if len(errs) > 0 || len(docs) != 1 || docs[0].File != filepath.Join(dir, "link", "a.yaml") {
		t.Fatalf("docs %+v errs %v", docs, errs)
	}
	// An entry that cannot be read is reported and the walk goes on (a dangling link: root
	// reads through any permission bits, so a link is the fault that can be made here).
	writeFile(t, dir, "m/a/x.yaml", fmt.Sprintf(good, "x"))
	writeFile(t, dir, "m/c/z.yaml", fmt.Sprintf(good, "z"))
	if err := os.MkdirAll(filepath.Join(dir, "m/b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "nowhere"), filepath.Join(dir, "m/b/y.yaml")); err != nil {
		t.Fatal(err)
	}
	docs, errs = ReadPaths(filepath.Join(dir, "m"))
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), filepath.Join("m", "b", "y.yaml")) || len(docs) != 2 {
		t.Fatalf("docs %d errs %v", len(docs), errs)
	}
}

// A name or key holding a newline is quoted, so it cannot print a line of its own.
func TestErrorsQuoteControlCharacters(t *testing.T) {
	docs, _ := ParseFile("m.yaml", []byte("tool: \"x\\nok: 3 tool manifests valid\"\n\"bad\\nkey\": 1\n"))
	_, errs := ValidateDocuments(docs)
	for _, e := range errs {
		if strings.Contains(e.Error(), "\n") {
			t.Errorf("error spans lines: %q", e.Error())
		}
	}
	if len(errs) < 2 {
		t.Fatalf("errs %v", errs)
	}
}

func TestReadPathsRefusesHugeFiles(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "huge.yaml")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(MaxFileBytes + 1); err != nil { // sparse: no disk used
		t.Fatal(err)
	}
	f.Close()
	docs, errs := ReadPaths(dir)
	if len(docs) != 0 || len(errs) != 1 || !strings.Contains(errs[0].Error(), "split it into several files") {
		t.Fatalf("docs %d errs %v", len(docs), errs)
	}
}

func TestReadFS(t *testing.T) {
	fsys := fstest.MapFS{
		"reg/a.yaml":         {Data: []byte("{tool: a, effect: read_only, permission: p}\n")},
		"reg/sub/b.json":     {Data: []byte(`{"tool": "b", "effect": "read_only", "permission": "p"}`)},
		"reg/.hidden/c.yaml": {Data: []byte("not: read\n")},
		"reg/link.yaml":      {Data: []byte("a.yaml"), Mode: fs.ModeSymlink},
		"reg/bad.yaml":       {Data: []byte("tool: x\ntool: y\n")},
		"other/d.yaml":       {Data: []byte("{tool: d}\n")},
	}
	docs, errs := ReadFS(fsys, "reg", "repo/")
	if len(docs) != 3 || docs[0].File != "repo/reg/a.yaml" || docs[2].File != "repo/reg/sub/b.json" {
		t.Fatalf("docs %+v", docs)
	}
	if len(errs) != 2 || !strings.Contains(errs[0].Error(), "repo/reg/bad.yaml:2:") || errs[1].Error() != "repo/reg/link.yaml: a link is not read: replace it with the file" {
		t.Fatalf("errs %v", errs)
	}
}
