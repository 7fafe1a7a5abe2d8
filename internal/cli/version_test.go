package cli

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

// `reversi version` prints the module version, the commit (unknown without VCS stamping, as in
// `go test`) and the toolchain, on one line.
func TestVersionCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Execute([]string{"version"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	got := strings.TrimSpace(out.String())
	if !strings.HasPrefix(got, "reversi ") || !strings.Contains(got, "(commit ") || !strings.HasSuffix(got, "; "+runtime.Version()+")") || got != BuildVersion().String() {
		t.Errorf("reversi version: %q", got)
	}
}
