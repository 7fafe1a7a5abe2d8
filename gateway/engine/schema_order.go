package engine

import (
	"cmp"
	"slices"
	"strconv"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// sortProblems orders schema problems by instance location, array indexes numerically
// (/paths/2 before /paths/10), then by the problem's text. jsonschema/v6 reports the problems
// of an object's properties in Go map order, which changes from call to call; without this the
// same call would list its problems, and pick its first five, differently each time (seed:
// Schema validation, "first five problems").
func sortProblems(leaves []*jsonschema.ValidationError) {
	slices.SortStableFunc(leaves, func(a, b *jsonschema.ValidationError) int {
		if c := compareLocations(a.InstanceLocation, b.InstanceLocation); c != 0 {
			return c
		}
		return cmp.Compare(problemText(a), problemText(b))
	})
}

// compareLocations compares two JSON pointers token by token; two tokens that are both
// array indexes compare as numbers, and a prefix comes first.
func compareLocations(a, b []string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		x, errx := strconv.Atoi(a[i])
		y, erry := strconv.Atoi(b[i])
		c := 0
		if errx == nil && erry == nil {
			c = cmp.Compare(x, y)
		} else {
			c = cmp.Compare(a[i], b[i])
		}
		if c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a), len(b))
}
