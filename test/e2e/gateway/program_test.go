package gateway

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// TestProgramName: the gateway is installed as reversi-gateway and runs as `reversi gateway`
// (seed "MCP gateway"). Both ./cmd/reversi-gateway and the reversi binary invoked through a
// symlink named reversi-gateway are the gateway command itself: --help lists the gateway's
// flags, and with an upstream they serve MCP on stdio.
func TestProgramName(t *testing.T) {
	for name, bin := range map[string]string{"cmd": bins.gateway, "symlink": bins.link} {
		t.Run(name, func(t *testing.T) {
			out, err := exec.Command(bin, "--help").CombinedOutput()
			if err != nil {
				t.Fatalf("%s --help: %v\n%s", bin, err, out)
			}
			help := string(out)
			for _, want := range []string{"Usage:\n  reversi-gateway [flags]", "--upstream-cmd", "--upstream-arg", "--upstream-url",
				"--config", "--manifests", "--store", "--data", "--mode", "--actor", "--run-id"} {
				if !strings.Contains(help, want) {
					t.Errorf("reversi-gateway --help lacks %q:\n%s", want, help)
				}
			}
			if strings.Contains(help, "  validate ") || strings.Contains(help, "  manifests ") || strings.Contains(help, "  controller ") {
				t.Errorf("reversi-gateway --help shows the reversi root's subcommands:\n%s", help)
			}

			node, args, _ := upstreams.Everything(t)
			p := startStdio(t, bin, "--store", "memory", "--upstream-cmd", node, "--upstream-arg", args[0], "--upstream-arg", args[1])
			if names := toolNames(t, p.cs); !slices.Contains(names, "echo") {
				t.Fatalf("tools through %s: %v, want server-everything's echo", bin, names)
			}
			res := call(t, p.cs, "echo", map[string]any{"message": "via " + name})
			if res.IsError || !strings.Contains(text(res), "via "+name) {
				t.Fatalf("echo through %s: %+v", bin, res)
			}
			if !strings.Contains(p.stderr.String(), engine.AutoObserveMessage) {
				t.Errorf("no start message on stderr:\n%s", p.stderr)
			}
		})
	}

	// The reversi binary under its own name is still the CLI root.
	out, err := exec.Command(bins.reversi, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Available Commands") || !strings.Contains(string(out), "gateway") {
		t.Fatalf("reversi --help: %v\n%s", err, out)
	}
	out, err = exec.Command(bins.reversi, "gateway", "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "reversi gateway [flags]") || !strings.Contains(string(out), "--upstream-cmd") {
		t.Fatalf("reversi gateway --help: %v\n%s", err, out)
	}
	// An unknown argument is an error on both names, with exit status 1.
	for _, bin := range []string{bins.link, bins.gateway} {
		out, err := exec.Command(bin, "--no-such-flag").CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "unknown flag: --no-such-flag") {
			t.Errorf("%s --no-such-flag: %v\n%s", bin, err, out)
		}
	}
}
