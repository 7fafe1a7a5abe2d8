package cli

import (
	"bytes"
	"strings"
	"testing"
)

// TestMainDispatch: argv[0] named reversi-gateway runs the gateway command as the root; any
// other name runs the reversi root.
func TestMainDispatch(t *testing.T) {
	for argv0, gw := range map[string]bool{"reversi-gateway": true, "/usr/local/bin/reversi-gateway": true,
		"reversi-gateway.exe": true, "reversi": false, "/bin/reversi": false, "reversi-gateway2": false} {
		if got := IsGatewayProgram(argv0); got != gw {
			t.Errorf("IsGatewayProgram(%q) = %v, want %v", argv0, got, gw)
		}
	}
	var out, errw bytes.Buffer
	if code := Main([]string{"/opt/reversi/reversi-gateway", "--help"}, &out, &errw); code != 0 {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
	if !strings.Contains(out.String(), "reversi-gateway [flags]") || !strings.Contains(out.String(), "--upstream-cmd") {
		t.Errorf("reversi-gateway --help:\n%s", out.String())
	}
	out.Reset()
	if code := Main([]string{"/opt/reversi/reversi", "--help"}, &out, &errw); code != 0 || !strings.Contains(out.String(), "Available Commands") {
		t.Errorf("reversi --help (exit %d):\n%s", code, out.String())
	}
	out.Reset()
	errw.Reset()
	if code := Main([]string{"reversi-gateway", "gateway"}, &out, &errw); code != 1 || !strings.Contains(errw.String(), `unknown command "gateway" for "reversi-gateway"`) {
		t.Errorf("reversi-gateway gateway: exit %d, stderr %q", code, errw.String())
	}
}
