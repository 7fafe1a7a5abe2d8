package policy

import (
	"context"
	"testing"

	"github.com/reversi-gitops/reversi/api/manifest"
)

const fixtures = "../../test/fixtures/policy/policy"

func loadFixtureManifests(t testing.TB) []*manifest.Manifest {
	t.Helper()
	docs, errs := manifest.ReadPaths("../../test/fixtures/policy/manifests")
	ms, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		t.Fatalf("manifests: %v", errs)
	}
	return ms
}

func loadFixtureSet(t testing.TB) *Set {
	t.Helper()
	s, errs := Load(fixtures+"/payments.yaml", fixtures+"/change-freeze.yaml", fixtures+"/content.yaml", fixtures+"/deletions.yaml")
	if len(errs) > 0 {
		t.Fatalf("policies: %v", errs)
	}
	return s
}

// Every fixture test passes, and every rule is covered by one.
func TestFixtureTestsPass(t *testing.T) {
	s := loadFixtureSet(t)
	results := s.RunTests(context.Background(), loadFixtureManifests(t))
	if len(results) < 20 {
		t.Fatalf("only %d tests", len(results))
	}
	for _, r := range results {
		if !r.Passed {
			t.Errorf("%s:%d: %s / %s: %s", r.File, r.Line, r.Policy, r.Name, r.Why)
		}
	}
	if un := s.Uncovered(results); len(un) > 0 {
		t.Errorf("uncovered: %v", un)
	}
}
