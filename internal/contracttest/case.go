// Package contracttest runs manifest contract tests (`reversi test`): for a fake call and a fake
// result, does a manifest produce the plan, undo arguments, verification and refusals a test
// expects? It touches no system; every decision comes from api/manifest's per-call functions,
// the same ones the gateway uses. Source: seed "Tool manifests", Contract tests.
package contracttest

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// Case is one contract test as read from a case file. Optional expectations are nil (or "")
// when the case does not state them.
type Case struct {
	File  string
	Line  int // line of the case object
	Index int // position in its file, 0-based

	Name string
	Tool string
	Args map[string]any // the call's arguments; empty when not given
	// Result is the fake structured result of a call that succeeds; Fail, when set, is the
	// message of a call that fails instead.
	Result any
	Fail   *string
	// After lists the tools run (and succeeding) before the call. nil means the manifest's
	// requires; an empty list runs nothing first.
	After []string

	ExpectPlan         manifest.PlanAction
	ExpectHandle       map[string]any
	ExpectVerification map[string]any
	VerifyWith         any // the read-back answer; set exactly when ExpectVerified is
	ExpectVerified     *bool
	ExpectDuplicate    *bool
	ExpectBlocked      *string
}

// Fields are a case's fields, in the seed's order; any other field is refused.
var Fields = []string{"name", "tool", "args", "result", "fail", "after", "expect_plan", "expect_handle",
	"expect_verification", "verify_with", "expect_verified", "expect_duplicate", "expect_blocked"}

// expectations are the fields that judge a call which ran; they mean nothing for a blocked one.
var expectations = []string{"expect_plan", "expect_handle", "expect_verification", "verify_with",
	"expect_verified", "expect_duplicate"}

// Read reads the case files and folders given (folders recursively: *.json, *.yaml, *.yml, in
// lexical order) strictly, and returns the cases in file order with every problem found.
// Cases come back only when there are no errors.
func Read(paths ...string) ([]Case, []error) {
	docs, errs := manifest.ReadPaths(paths...)
	cases, cerrs := Decode(docs)
	errs = append(errs, cerrs...)
	if len(errs) > 0 {
		return nil, errs
	}
	return cases, nil
}

// Decode turns parsed documents into cases: unknown fields, missing name or tool, wrong types,
// contradictory fields and duplicate names are all reported together.
func Decode(docs []manifest.Document) ([]Case, []error) {
	var cases []Case
	var errs []error
	firstByName := map[string]*Case{}
	for i := range docs {
		c, es := decodeCase(&docs[i])
		errs = append(errs, es...)
		if c.Name != "" {
			// Output lines name the case, so two cases with one name could not be told apart.
			if first, dup := firstByName[c.Name]; dup {
				errs = append(errs, &manifest.FieldError{File: c.File, Line: docs[i].Line("name"), Tool: label(c.Name, c.Index), Path: "name",
					Message: fmt.Sprintf("duplicate case name: also at %s:%d; give each case its own name", first.File, first.Line)})
			} else {
				firstByName[c.Name] = &c
			}
		}
		cases = append(cases, c)
	}
	return cases, errs
}

func label(name string, index int) string {
	if name == "" {
		return fmt.Sprintf("case #%d", index+1)
	}
	return fmt.Sprintf("case %q", name)
}

// caseDecoder reads one document, collecting every problem.
type caseDecoder struct {
	doc  *manifest.Document
	obj  map[string]any
	lbl  string
	errs []error
}

func (d *caseDecoder) add(field, format string, args ...any) {
	d.errs = append(d.errs, &manifest.FieldError{File: d.doc.File, Line: d.doc.Line(field), Tool: d.lbl, Path: field, Message: fmt.Sprintf(format, args...)})
}

func (d *caseDecoder) has(field string) bool {
	_, ok := d.obj[field]
	return ok
}

// text reads a string field; required ones must be present, and a present one must not be empty.
func (d *caseDecoder) text(field string, required bool, hint string) *string {
	v, ok := d.obj[field]
	if !ok {
		if required {
			d.add(field, "required: %s", hint)
		}
		return nil
	}
	s, isStr := v.(string)
	if !isStr || s == "" {
		d.add(field, "must be a non-empty string: %s (found %s)", hint, manifest.Describe(v))
		return nil
	}
	return &s
}

func (d *caseDecoder) object(field string) map[string]any {
	v, ok := d.obj[field]
	if !ok {
		return nil
	}
	m, isObj := v.(map[string]any)
	if !isObj {
		d.add(field, "must be an object, found %s", manifest.Describe(v))
		return nil
	}
	return m
}

func (d *caseDecoder) boolean(field string) *bool {
	v, ok := d.obj[field]
	if !ok {
		return nil
	}
	b, isBool := v.(bool)
	if !isBool {
		d.add(field, "must be true or false, found %s", manifest.Describe(v))
		return nil
	}
	return &b
}

func decodeCase(doc *manifest.Document) (Case, []error) {
	c := Case{File: doc.File, Line: doc.Line(""), Index: doc.Index}
	d := &caseDecoder{doc: doc, lbl: label("", doc.Index)}
	obj, ok := doc.Value.(map[string]any)
	if !ok {
		d.add("", "a case must be an object, found %s", manifest.Describe(doc.Value))
		return c, d.errs
	}
	d.obj = obj
	if n, ok := obj["name"].(string); ok && n != "" {
		c.Name = n
		d.lbl = label(n, doc.Index)
	}

	var unknown []string
	for k := range obj {
		if !slices.Contains(Fields, k) {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		d.add(k, "unknown field: remove it or fix its name (known fields: %s)", strings.Join(Fields, ", "))
	}

	d.text("name", true, "say what the case checks; it names the case in the report")
	if t := d.text("tool", true, "the tool the case calls"); t != nil {
		c.Tool = *t
	}
	c.Args = map[string]any{}
	if a := d.object("args"); a != nil {
		c.Args = a
	}
	c.Result = obj["result"]
	c.Fail = d.text("fail", false, "the message the failing call returns")
	if d.has("result") && d.has("fail") {
		d.add("fail", "result and fail exclude each other: a call either succeeds with result or fails with fail")
	}
	if v, ok := obj["after"]; ok {
		list, isList := v.([]any)
		if !isList {
			d.add("after", "must be a list of tool names, found %s", manifest.Describe(v))
		} else {
			c.After = make([]string, 0, len(list))
			for i, e := range list {
				s, isStr := e.(string)
				if !isStr || s == "" {
					d.add(fmt.Sprintf("after[%d]", i), "must be a tool name, found %s", manifest.Describe(e))
					continue
				}
				c.After = append(c.After, s)
			}
		}
	}
	if v, ok := obj["expect_plan"]; ok {
		s, _ := v.(string)
		if !slices.Contains(manifest.PlanActions, manifest.PlanAction(s)) {
			d.add("expect_plan", "must be one of compensate, skip, unrecoverable, not_undone, found %s", manifest.Describe(v))
		} else {
			c.ExpectPlan = manifest.PlanAction(s)
		}
	}
	c.ExpectHandle = d.object("expect_handle")
	c.ExpectVerification = d.object("expect_verification")
	c.VerifyWith = obj["verify_with"]
	c.ExpectVerified = d.boolean("expect_verified")
	switch {
	case d.has("verify_with") && !d.has("expect_verified"):
		d.add("verify_with", "needs expect_verified: say whether this read-back should be accepted")
	case d.has("expect_verified") && !d.has("verify_with"):
		d.add("expect_verified", "needs verify_with: the read-back answer to judge")
	}
	c.ExpectDuplicate = d.boolean("expect_duplicate")
	c.ExpectBlocked = d.text("expect_blocked", false, "a part of the reason the call is refused for")
	if d.has("expect_blocked") {
		// A blocked call never runs, so nothing about its outcome can be checked.
		for _, f := range append([]string{"result", "fail"}, expectations...) {
			if d.has(f) {
				d.add(f, "cannot be combined with expect_blocked: a blocked call never runs; move it to a separate case")
			}
		}
	}
	return c, d.errs
}
