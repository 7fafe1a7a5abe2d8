package contracttest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// testManifests cover every effect, a draft, a deprecated tool, requires, idempotency scopes and
// a verified and an unverified compensation.
const testManifests = `
- tool: stripe.get_charge
  effect: read_only
  permission: payments:read
- tool: stripe.create_charge
  effect: compensable
  permission: payments:write
  idempotency: { key: "charge-{{args.order_id}}", scope: global }
  compensation:
    tool: stripe.refund
    residue: [the charge still appears on the statement]
    argument_map: { charge_id: $result.id, amount: $args.amount }
    verification:
      tool: stripe.get_charge
      arguments: { charge_id: $result.id }
      expect: { refunded: true }
- tool: stripe.refund
  effect: idempotent
  permission: payments:write
- tool: auth.login
  effect: idempotent
  permission: auth:login
- tool: notes.create
  effect: reversible
  permission: notes:write
  requires: [auth.login]
  compensation:
    tool: notes.delete
    kind: inverse
    argument_map: { id: $result.note.id }
- tool: notes.delete
  effect: idempotent
  permission: notes:write
- tool: mail.send
  effect: irreversible
  permission: mail:send
  idempotency: { key: "{{args.to}}" }
- tool: beta.tool
  effect: idempotent
  permission: beta:use
  status: draft
- tool: old.tool
  effect: idempotent
  permission: payments:write
  status: deprecated
  replaced_by: stripe.refund
`

func testSuite(t *testing.T) *Suite {
	t.Helper()
	docs, err := manifest.ParseFile("manifests.yaml", []byte(testManifests))
	if err != nil {
		t.Fatal(err)
	}
	ms, errs := manifest.ValidateDocuments(docs)
	if len(errs) > 0 {
		t.Fatalf("test manifests are invalid: %v", errs)
	}
	return NewSuite(ms)
}

// decodeOne reads one case written in YAML; it must be valid.
func decodeOne(t *testing.T, src string) Case {
	t.Helper()
	docs, err := manifest.ParseFile("case.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	cases, errs := Decode(docs)
	if len(errs) > 0 || len(cases) != 1 {
		t.Fatalf("case does not read: %v", errs)
	}
	return cases[0]
}

const charge = "tool: stripe.create_charge\nargs: { order_id: o1, amount: 2500 }\n"

func TestRun(t *testing.T) {
	s := testSuite(t)
	tests := []struct {
		name string
		src  string // the case, without its name
		why  string // "" when the case must pass
	}{
		// The seed's three cases.
		{"seed refund", charge + `result: { id: ch_1 }
expect_plan: compensate
expect_handle: { charge_id: ch_1, amount: 2500 }
expect_verification: { charge_id: ch_1 }
verify_with: { refunded: true }
expect_verified: true`, ""},
		{"seed failed charge", charge + "fail: card declined", ""},
		{"seed duplicate", charge + "result: { id: ch_1 }\nexpect_duplicate: true", ""},

		// expect_plan
		{"plan skip after a failure", charge + "fail: declined\nexpect_plan: skip", ""},
		{"plan skip for a read", "tool: stripe.get_charge\nargs: { charge_id: ch_1 }\nresult: { refunded: false }\nexpect_plan: skip", ""},
		{"plan not_undone for irreversible", "tool: mail.send\nargs: { to: a@example.com }\nexpect_plan: not_undone", ""},
		{"plan unrecoverable", charge + "result: { status: ok }\nexpect_plan: unrecoverable", ""},
		{"plan mismatch", charge + "result: { status: ok }\nexpect_plan: compensate",
			"expected plan compensate, got unrecoverable (a referenced value was missing: $result.id)"},
		{"plan mismatch on failure", charge + "fail: declined\nexpect_plan: compensate",
			"expected plan compensate, got skip (the call failed: nothing to undo)"},

		// expect_handle
		{"handle from a nested result", "tool: notes.create\nresult: { note: { id: n1 } }\nexpect_handle: { id: n1 }", ""},
		{"handle mismatch", charge + "result: { id: ch_1 }\nexpect_handle: { charge_id: ch_1, amount: 100 }",
			`expected handle {"amount":100,"charge_id":"ch_1"}, got {"amount":2500,"charge_id":"ch_1"}`},
		{"handle when nothing is undone", charge + "fail: declined\nexpect_handle: { charge_id: ch_1 }",
			`expected handle {"charge_id":"ch_1"}, but nothing is undone: plan skip (the call failed: nothing to undo)`},

		// expect_verification
		{"verification mismatch", charge + "result: { id: ch_1 }\nexpect_verification: { charge_id: ch_2 }",
			`expected verification {"charge_id":"ch_2"}, got {"charge_id":"ch_1"}`},
		{"verification without one declared", "tool: notes.create\nresult: { note: { id: n1 } }\nexpect_verification: { id: n1 }",
			`expected verification {"id":"n1"}, but the manifest declares no verification`},
		{"verification when nothing is undone", charge + "fail: declined\nexpect_verification: { charge_id: ch_1 }",
			`expected verification {"charge_id":"ch_1"}, but no undo runs, so no read-back either: plan skip (the call failed: nothing to undo)`},

		// verify_with + expect_verified
		{"read-back refused as expected", charge + "result: { id: ch_1 }\nverify_with: { refunded: false }\nexpect_verified: false", ""},
		{"read-back refused unexpectedly", charge + "result: { id: ch_1 }\nverify_with: { refunded: false }\nexpect_verified: true",
			"expected the read-back to be accepted, but it was refused (refunded: expected true, got false)"},
		{"read-back missing the field", charge + "result: { id: ch_1 }\nverify_with: { status: ok }\nexpect_verified: true",
			"expected the read-back to be accepted, but it was refused (refunded: expected true, got nothing)"},
		{"read-back accepted unexpectedly", charge + "result: { id: ch_1 }\nverify_with: { refunded: true, amount: 2500 }\nexpect_verified: false",
			`expected the read-back to be refused, but it was accepted (expect {"refunded":true})`},
		{"read-back without verification", "tool: notes.create\nresult: { note: { id: n1 } }\nverify_with: {}\nexpect_verified: true",
			"expect_verified: the manifest declares no verification, so no read-back is checked"},

		// expect_duplicate
		{"a failed call frees its key", charge + "fail: declined\nexpect_duplicate: false", ""},
		{"no key, no duplicate", "tool: notes.create\nresult: { note: { id: n1 } }\nexpect_duplicate: false", ""},
		{"run-scoped key stands in the run", "tool: mail.send\nargs: { to: a@example.com }\nexpect_duplicate: true", ""},
		{"duplicate expected after a failure", charge + "fail: declined\nexpect_duplicate: true",
			"expected a second identical call to be refused as a duplicate, but the first call failed, which frees its key"},
		{"duplicate expected without a key", "tool: notes.create\nresult: { note: { id: n1 } }\nexpect_duplicate: true",
			"expected a second identical call to be refused as a duplicate, but the manifest declares no idempotency key"},
		{"duplicate not expected", charge + "result: { id: ch_1 }\nexpect_duplicate: false",
			"expected a second identical call to run, but it was blocked: a duplicate of an earlier stripe.create_charge call that still stands (key charge-o1, scope global)"},

		// expect_blocked
		{"blocked: no manifest", "tool: ghost.tool\nexpect_blocked: no manifest for ghost.tool", ""},
		{"blocked: draft", "tool: beta.tool\nexpect_blocked: is a draft", ""},
		{"blocked: requirement not met", "tool: notes.create\nafter: []\nexpect_blocked: requires auth.login", ""},
		{"blocked: key argument missing", "tool: stripe.create_charge\nargs: { amount: 1 }\nexpect_blocked: argument order_id is missing", ""},
		{"blocked: key argument not plain", "tool: stripe.create_charge\nargs: { order_id: [1] }\nexpect_blocked: not a plain value", ""},
		{"blocked for another reason", "tool: beta.tool\nexpect_blocked: no manifest",
			`expected the call to be blocked for "no manifest", but it was blocked for: the manifest for beta.tool is a draft: a reviewer must approve it before the tool can be called`},
		{"blocked expected but ran", charge + "expect_blocked: draft", `expected the call to be blocked for "draft", but it ran`},
		{"blocked unexpectedly", "tool: ghost.tool\nexpect_plan: skip", "the call was blocked: no manifest for ghost.tool"},

		// after
		{"after defaults to requires", "tool: notes.create\nresult: { note: { id: n1 } }\nexpect_plan: compensate", ""},
		{"after named explicitly", "tool: notes.create\nafter: [auth.login, stripe.refund]\nresult: { note: { id: n1 } }", ""},
		{"after without a manifest", "tool: notes.create\nafter: [auth.login, ghost.tool]", "after: no manifest for ghost.tool"},
		{"after that misses the requirement", "tool: notes.create\nafter: [stripe.refund]",
			"the call was blocked: notes.create requires auth.login to have succeeded earlier in the run"},

		// lifecycle and several failures at once
		{"deprecated still runs", "tool: old.tool\nexpect_plan: skip\nexpect_duplicate: false", ""},
		{"an idempotent tool needs no undo (seed: effects)", "tool: stripe.refund\nargs: { charge_id: ch_1 }\nexpect_plan: skip", ""},
		{"every failure is reported", charge + "fail: declined\nexpect_plan: compensate\nexpect_duplicate: true",
			"expected plan compensate, got skip (the call failed: nothing to undo); expected a second identical call to be refused as a duplicate, but the first call failed, which frees its key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := decodeOne(t, fmt.Sprintf("name: %q\n%s", tt.name, tt.src))
			got := s.Run(&c)
			if got.Name != tt.name {
				t.Errorf("result name %q, want %q", got.Name, tt.name)
			}
			if tt.why == "" {
				if !got.Passed {
					t.Fatalf("case failed: %s", got.Why)
				}
				return
			}
			if got.Passed {
				t.Fatalf("case passed, want failure %q", tt.why)
			}
			if got.Why != tt.why {
				t.Errorf("why:\n got  %s\n want %s", got.Why, tt.why)
			}
		})
	}
}

// Each case starts a fresh run: a key standing in one case does not make the next a duplicate.
func TestRunIsFreshPerCase(t *testing.T) {
	s := testSuite(t)
	c := decodeOne(t, "name: twice\n"+charge+"result: { id: ch_1 }\nexpect_duplicate: true")
	for i := range 2 {
		if r := s.Run(&c); !r.Passed {
			t.Fatalf("run %d: %s", i+1, r.Why)
		}
	}
}

func TestReadErrors(t *testing.T) {
	tests := []struct {
		name string
		file string // file name decides JSON or YAML
		src  string
		want []string // every error, in order
	}{
		{"unknown field with its line", "a.yaml", `- name: one
  tool: stripe.refund
  expect_plans: skip
`, []string{`a.yaml:3: case "one": expect_plans: unknown field: remove it or fix its name (known fields: ` + strings.Join(Fields, ", ") + ")"}},
		{"missing name and tool name the index", "a.yaml", `- name: one
  tool: stripe.refund
- args: {}
`, []string{
			"a.yaml:3: case #2: name: required: say what the case checks; it names the case in the report",
			"a.yaml:3: case #2: tool: required: the tool the case calls",
		}},
		{"result and fail together", "a.yaml", `name: both
tool: stripe.refund
result: {}
fail: declined
`, []string{`a.yaml:4: case "both": fail: result and fail exclude each other: a call either succeeds with result or fails with fail`}},
		{"verify_with alone", "a.yaml", "name: v\ntool: t\nverify_with: {}\n",
			[]string{`a.yaml:3: case "v": verify_with: needs expect_verified: say whether this read-back should be accepted`}},
		{"expect_verified alone", "a.yaml", "name: v\ntool: t\nexpect_verified: true\n",
			[]string{`a.yaml:3: case "v": expect_verified: needs verify_with: the read-back answer to judge`}},
		{"expect_blocked with outcome and expectations", "a.yaml", "name: b\ntool: t\nresult: {}\nexpect_plan: skip\nexpect_blocked: draft\n",
			[]string{
				`a.yaml:3: case "b": result: cannot be combined with expect_blocked: a blocked call never runs; move it to a separate case`,
				`a.yaml:4: case "b": expect_plan: cannot be combined with expect_blocked: a blocked call never runs; move it to a separate case`,
			}},
		{"wrong types", "a.yaml", `name: types
tool: 3
args: [1]
fail: ""
after: [ok, 2]
expect_plan: undo
expect_handle: x
expect_verification: null
expect_duplicate: "yes"
`, []string{
			`a.yaml:2: case "types": tool: must be a non-empty string: the tool the case calls (found number 3)`,
			`a.yaml:3: case "types": args: must be an object, found a list`,
			`a.yaml:4: case "types": fail: must be a non-empty string: the message the failing call returns (found string "")`,
			`a.yaml:5: case "types": after[1]: must be a tool name, found number 2`,
			`a.yaml:6: case "types": expect_plan: must be one of compensate, skip, unrecoverable, not_undone, found string "undo"`,
			`a.yaml:7: case "types": expect_handle: must be an object, found string "x"`,
			`a.yaml:8: case "types": expect_verification: must be an object, found null`,
			`a.yaml:9: case "types": expect_duplicate: must be true or false, found string "yes"`,
		}},
		{"expect_blocked not a string", "a.yaml", "name: b\ntool: t\nexpect_blocked: true\n",
			[]string{`a.yaml:3: case "b": expect_blocked: must be a non-empty string: a part of the reason the call is refused for (found boolean true)`}},
		{"duplicate names", "a.yaml", "- name: same\n  tool: t\n- name: same\n  tool: u\n",
			[]string{`a.yaml:3: case "same": name: duplicate case name: also at a.yaml:1; give each case its own name`}},
		{"JSON case file", "a.json", "[\n {\"name\": \"j\",\n  \"tool\": \"t\",\n  \"colour\": 1}\n]",
			[]string{`a.json:4: case "j": colour: unknown field: remove it or fix its name (known fields: ` + strings.Join(Fields, ", ") + ")"}},
		{"syntax error keeps file and line", "a.yaml", "name: x\ntool: [\n",
			nil}, // checked below: only its location is ours
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, tt.file)
			if err := os.WriteFile(path, []byte(tt.src), 0o644); err != nil {
				t.Fatal(err)
			}
			cases, errs := Read(path)
			if cases != nil {
				t.Errorf("got cases %v despite errors", cases)
			}
			var got []string
			for _, e := range errs {
				got = append(got, strings.ReplaceAll(e.Error(), dir+string(filepath.Separator), ""))
			}
			if tt.want == nil {
				if len(got) != 1 || !strings.HasPrefix(got[0], "a.yaml:2: invalid YAML") {
					t.Fatalf("errors %q, want one invalid YAML error at a.yaml:2", got)
				}
				return
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("errors:\n got  %q\n want %q", got, tt.want)
			}
		})
	}
}

// Files in a folder are read in lexical order, all their errors together.
func TestReadFolder(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"b.test.yaml": "name: second\ntool: stripe.refund\n",
		"a.json":      `{"name": "first", "tool": "stripe.refund"}`,
		"sub/c.yml":   "name: third\ntool: stripe.refund\n",
		"notes.txt":   "not a case",
	}
	for name, src := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cases, errs := Read(dir)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	var names []string
	for _, c := range cases {
		names = append(names, c.Name)
	}
	if want := []string{"first", "second", "third"}; !slices.Equal(names, want) {
		t.Errorf("cases %q, want %q", names, want)
	}

	if err := os.WriteFile(filepath.Join(dir, "d.yaml"), []byte("name: bad\nfail: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "e.yaml"), []byte("tool: t\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errs := Read(dir); len(errs) != 2 {
		t.Errorf("got %d errors, want one per broken file: %v", len(errs), errs)
	}
}

func TestUncovered(t *testing.T) {
	s := testSuite(t)
	cases := []Case{
		{Tool: "stripe.create_charge"},
		{Tool: "beta.tool"},  // a draft is covered by a case calling it
		{Tool: "old.tool"},   // and so is a deprecated tool
		{Tool: "ghost.tool"}, // a tool without a manifest counts for nothing
	}
	got := s.Uncovered(cases)
	// stripe.get_charge is read-only: never listed.
	want := []string{"auth.login", "mail.send", "notes.create", "notes.delete", "stripe.refund"}
	if !slices.Equal(got, want) {
		t.Errorf("uncovered %q, want %q", got, want)
	}
	if got := s.Uncovered(nil); len(got) != 8 {
		t.Errorf("with no cases %d tools uncovered, want every mutating one (8): %q", len(got), got)
	}
}
