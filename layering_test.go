package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The packages flow one way (DESIGN.md, "Layout"): api ← pkg ← gateway, controllers ← internal
// (the binaries' wiring). A library the gateway or the controllers use lives in pkg/, never in
// internal/, and nothing below the CLI imports it.
func TestPackagesFlowOneWay(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`,
		"./api/...", "./pkg/...", "./gateway/...", "./controllers/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const mod = "github.com/reversi-gitops/reversi/"
	// forbidden[layer] lists the folders a package of that layer must not import.
	forbidden := map[string][]string{
		"api/":         {"pkg/", "gateway/", "controllers/", "internal/"},
		"pkg/":         {"gateway/", "controllers/", "internal/"},
		"gateway/":     {"controllers/", "internal/"},
		"controllers/": {"gateway/proxy", "internal/cli"},
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], mod)
		for layer, bad := range forbidden {
			if !strings.HasPrefix(pkg, layer) {
				continue
			}
			checked++
			for _, imp := range fields[1:] {
				rel, ok := strings.CutPrefix(imp, mod)
				if !ok {
					continue
				}
				for _, b := range bad {
					if strings.HasPrefix(rel, b) {
						t.Errorf("%s imports %s: a %s package must not import %s (move the shared code into pkg/)", pkg, rel, layer, b)
					}
				}
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d packages checked; go list printed:\n%s", checked, out)
	}
}
