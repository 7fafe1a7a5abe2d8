package rollback

import (
	"reflect"
	"testing"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// TestVerificationArguments: read-back references resolve from the journaled handle through
// argument_map (same reference, or a prefix of it followed into the value); others are missing.
func TestVerificationArguments(t *testing.T) {
	c := &manifest.Compensation{
		ArgumentMap: map[string]string{"relations": "$args.relations", "ids": "$result.entities.*.name"},
		Verification: &manifest.Verification{Arguments: map[string]string{
			"from": "$args.relations.*.from", "names": "$result.entities.*.name", "whole": "$args.relations", "other": "$args.nope"}},
	}
	handle := map[string]any{
		"relations": []any{map[string]any{"from": "a", "to": "b"}, map[string]any{"from": "c", "to": "d"}},
		"ids":       []any{"x", "y"},
	}
	got, missing := VerificationArguments(c, handle)
	want := map[string]any{"from": []any{"a", "c"}, "names": []any{"x", "y"}, "whole": handle["relations"]}
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(missing, []string{"$args.nope"}) {
		t.Errorf("got %v, missing %v", got, missing)
	}
	if k1, k2 := CompensationKey("r", 3, "t"), CompensationKey("r", 3, "t"); k1 != k2 || k1 == CompensationKey("r", 4, "t") {
		t.Errorf("keys %s %s", k1, k2)
	}
}
