package source

import (
	"testing"

	"github.com/Masterminds/semver/v3"
)

func TestHighestMatching(t *testing.T) {
	tags := []string{"v1.0.0", "1.0.0", "v1.2.0", "v1.10.0", "v2.0.0-rc.1", "v2.0.0+build.2", "v2.0.0+build.10", "release-3", "latest", "v1.9"}
	cases := map[string]string{
		"*":                "v2.0.0+build.2", // equal precedence: the lexically greatest name
		"1.x":              "v1.10.0",        // numeric, not lexical, ordering
		"~1.9":             "v1.9",           // "v1.9" parses as 1.9.0
		"=1.0.0":           "v1.0.0",         // "1.0.0" and "v1.0.0" tie; "v1.0.0" sorts last
		">=2.0.0-rc.0":     "v2.0.0+build.2",
		"<2.0.0-0":         "v1.10.0",
		">=2.0.0-0 <2.0.0": "v2.0.0-rc.1",
		">=4":              "",
	}
	for constraint, want := range cases {
		c, err := semver.NewConstraint(constraint)
		if err != nil {
			t.Fatal(err)
		}
		if got := highestMatching(c, tags); got != want {
			t.Errorf("%s: got %q, want %q", constraint, got, want)
		}
	}
}
