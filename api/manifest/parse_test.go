package manifest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
		{"list of scalars", "m.yaml", "- tool: a\n- 3\n", 2, "entry 2: expected an object, found a scalar"},
		{"merge key", "m.yaml", "base: &b {effect: read_only}\nx:\n  <<: *b\n", 3, "merge keys"},
		{"non-string key", "m.yaml", "? [a, b]\n: 1\n", 1, "keys must be plain strings"},
		{"alias containing itself", "m.yaml", "a: &a [*a]\n", 1, "an alias contains itself"},
		{"alias bomb", "m.yaml", aliasBomb, 0, "too many values"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseFile(c.file, []byte(c.body))
			if err == nil {
				t.Fatal("no error")
			}
			fe, ok := err.(*FieldError)
			if !ok {
				t.Fatalf("error %T %v", err, err)
			}
			if fe.File != c.file || (c.line > 0 && fe.Line != c.line) || !strings.Contains(fe.Message, c.want) {
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
	if len(errs) != 2 || len(docs) != 1 {
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
