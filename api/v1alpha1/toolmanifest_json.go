package v1alpha1

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// ManifestObject returns the spec as the raw manifest object the validator reads
// (manifest.Validate): a map[string]any of the manifest format's snake_case fields, with
// json.Number numbers, holding exactly what the spec says (unions in the form they were
// written, values the API server kept but cannot type included), so that the validator
// judges the object and not a cleaned-up copy of it.
func (in *ToolManifest) ManifestObject() (map[string]any, error) {
	return in.Spec.ManifestObject()
}

// ManifestObject returns the spec as the raw manifest object the validator reads; see
// (*ToolManifest).ManifestObject.
func (in *ToolManifestSpec) ManifestObject() (map[string]any, error) {
	b, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("encoding the ToolManifest spec: %w", err)
	}
	var obj map[string]any
	if err := decodeNumbers(b, &obj); err != nil {
		return nil, fmt.Errorf("decoding the ToolManifest spec: %w", err)
	}
	return obj, nil
}

// ToolManifestSpecFromObject reads a raw manifest object (as decoded from a manifest file's
// JSON or YAML) into a spec, strictly: an unknown field or a value of the wrong type is an
// error, as the API server would refuse it. The unions (approval, requires entries) accept any
// value, as the API server does; the validator judges them. A null optional field is dropped,
// as the API server drops it (`approval: null` becomes no approval), so validate a manifest
// before turning it into a spec.
func ToolManifestSpecFromObject(raw any) (*ToolManifestSpec, error) {
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, fmt.Errorf("encoding the manifest: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var spec ToolManifestSpec
	if err := dec.Decode(&spec); err != nil {
		return nil, fmt.Errorf("the manifest does not fit a ToolManifest spec: %w", err)
	}
	return &spec, nil
}

// MarshalJSON writes the duration as a string (Text) or a number of milliseconds.
func (d ManifestDuration) MarshalJSON() ([]byte, error) {
	if d.Text != "" {
		return json.Marshal(d.Text)
	}
	return json.Marshal(d.Milliseconds)
}

// UnmarshalJSON reads a string or a whole number. Anything else is an error (the API server
// refuses such values before a client can read them).
func (d *ManifestDuration) UnmarshalJSON(b []byte) error {
	*d = ManifestDuration{}
	var v any
	if err := decodeNumbers(b, &v); err != nil {
		return err
	}
	switch x := v.(type) {
	case string:
		d.Text = x
		return nil
	case json.Number:
		n, err := x.Int64()
		if err != nil {
			return fmt.Errorf("duration %s is not a whole number of milliseconds", x)
		}
		d.Milliseconds = n
		return nil
	}
	return fmt.Errorf("a duration must be a number of milliseconds or a string such as 30s, found %s", b)
}

// String is the duration as written: the text form, or the milliseconds followed by "ms".
func (d ManifestDuration) String() string {
	if d.Text != "" {
		return d.Text
	}
	return fmt.Sprintf("%dms", d.Milliseconds)
}

// manifestApprovalFields is ManifestApproval without its methods, for the object form.
type manifestApprovalFields ManifestApproval

// MarshalJSON writes Raw when set, else the string form when Word is set, else the object form.
func (a ManifestApproval) MarshalJSON() ([]byte, error) {
	switch {
	case len(a.Raw) > 0:
		return compactJSON(a.Raw)
	case a.Word != "":
		return json.Marshal(a.Word)
	default:
		return json.Marshal(manifestApprovalFields(a))
	}
}

// UnmarshalJSON reads any JSON value: a string into Word, an object of the known fields into
// them, and anything else (or an object the fields cannot hold exactly) into Raw.
func (a *ManifestApproval) UnmarshalJSON(b []byte) error {
	*a = ManifestApproval{}
	if isJSONString(b) {
		if err := json.Unmarshal(b, &a.Word); err != nil || a.Word != "" {
			return err
		}
		return keepRaw(&a.Raw, b) // "" cannot be told from the object form by Word
	}
	var fields manifestApprovalFields
	if exactObject(b, &fields) {
		*a = ManifestApproval(fields)
		return nil
	}
	return keepRaw(&a.Raw, b)
}

// manifestRequirementFields is ManifestRequirement without its methods, for the object form.
type manifestRequirementFields ManifestRequirement

// MarshalJSON writes Raw when set, else the tool name when Name is set, else the object form.
func (r ManifestRequirement) MarshalJSON() ([]byte, error) {
	switch {
	case len(r.Raw) > 0:
		return compactJSON(r.Raw)
	case r.Name != "":
		return json.Marshal(r.Name)
	default:
		return json.Marshal(manifestRequirementFields(r))
	}
}

// UnmarshalJSON reads any JSON value: a string into Name, an object of the known fields into
// them, and anything else (or an object the fields cannot hold exactly) into Raw.
func (r *ManifestRequirement) UnmarshalJSON(b []byte) error {
	*r = ManifestRequirement{}
	if isJSONString(b) {
		if err := json.Unmarshal(b, &r.Name); err != nil || r.Name != "" {
			return err
		}
		return keepRaw(&r.Raw, b) // "" cannot be told from the object form by Name
	}
	var fields manifestRequirementFields
	if exactObject(b, &fields) {
		*r = ManifestRequirement(fields)
		return nil
	}
	return keepRaw(&r.Raw, b)
}

// isJSONString reports whether the JSON value b is a string.
func isJSONString(b []byte) bool {
	t := bytes.TrimSpace(b)
	return len(t) > 0 && t[0] == '"'
}

// exactObject decodes b into the struct pointed to by into and reports whether b is an object
// that the struct holds exactly: no unknown field, no value of another type, nothing lost
// (such as a null or an empty string that the struct would drop). Encoding the struct again
// must give the same JSON value.
func exactObject(b []byte, into any) bool {
	if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '{' {
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		return false
	}
	again, err := json.Marshal(into)
	if err != nil {
		return false
	}
	var want, got any
	if decodeNumbers(b, &want) != nil || decodeNumbers(again, &got) != nil {
		return false
	}
	return reflect.DeepEqual(want, got)
}

// keepRaw stores a copy of b (compacted) after checking that it is JSON.
func keepRaw(dst *json.RawMessage, b []byte) error {
	c, err := compactJSON(b)
	if err != nil {
		return err
	}
	*dst = c
	return nil
}

func compactJSON(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return nil, err
	}
	if buf.Len() == 0 {
		return nil, errors.New("empty JSON value")
	}
	return buf.Bytes(), nil
}

// decodeNumbers decodes one JSON value keeping numbers as json.Number, and refuses trailing
// data.
func decodeNumbers(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("unexpected data after the JSON value: %s", strings.TrimSpace(string(b[dec.InputOffset():])))
	}
	return nil
}
