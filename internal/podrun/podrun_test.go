package podrun

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestLocalise(t *testing.T) {
	mounts := map[string]string{"/tmp": "/work/pod/tmp", "/etc/reversi/config": "/tmp/x/config"}
	for in, want := range map[string]string{
		"/tmp":                             "/work/pod/tmp",
		"/etc/reversi/config/gateway.yaml": "/tmp/x/config/gateway.yaml", // not rewritten again under /tmp
		"keys: /tmp/a and /tmp/b":          "keys: /work/pod/tmp/a and /work/pod/tmp/b",
		"/var/lib/reversi":                 "/var/lib/reversi",
	} {
		if got := Localise(in, mounts); got != want {
			t.Errorf("Localise(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestProcessStopsItsGroup(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// The shell starts a child that ignores nothing: Stop must end both (the whole group).
	p := startSleeper(t, sh, dir)
	peak, err := p.PeakRSS()
	if err != nil || peak <= 0 {
		t.Fatalf("PeakRSS = %d, %v", peak, err)
	}
	if exited, _ := p.Exited(); exited {
		t.Fatal("exited before Stop")
	}
	p.Stop()
	if exited, err := p.Exited(); !exited || err == nil {
		t.Fatalf("after Stop: exited %v, %v (want killed by SIGTERM)", exited, err)
	}
	// The child got SIGTERM too; it is gone once init has reaped it.
	if err := Poll(t.Context(), 10*time.Second, func() string {
		if err := syscall.Kill(-p.PID(), 0); !errors.Is(err, syscall.ESRCH) {
			return "the process group is still there"
		}
		return ""
	}); err != nil {
		t.Error(err)
	}
	p.Stop() // a second Stop does nothing
}

// Signal reaches the process alone: its group's other process (the shell's child) stays, and
// Wait reports the exit with its signal; before the signal it times out.
func TestProcessSignalAlone(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	p := startSleeper(t, sh, t.TempDir())
	t.Cleanup(func() { _ = syscall.Kill(-p.PID(), syscall.SIGKILL) })
	if exited, _ := p.Wait(100 * time.Millisecond); exited {
		t.Fatal("exited before the signal")
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited, err := p.Wait(10 * time.Second)
	var ee *exec.ExitError
	if !exited || !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Fatalf("after SIGTERM: exited %v, %v (want ended by SIGTERM)", exited, err)
	}
	if err := syscall.Kill(-p.PID(), 0); err != nil {
		t.Errorf("the shell's child got the signal too (its group is gone: %v)", err)
	}
}

// A container's args expand $(VAR) from its env as the kubelet does: $$ escapes, an unknown
// variable stays as written.
func TestExpandVars(t *testing.T) {
	vars := map[string]string{"POD_NAMESPACE": "agents", "EMPTY": ""}
	for in, want := range map[string]string{
		"--watch-namespaces=$(POD_NAMESPACE)": "--watch-namespaces=agents",
		"$(POD_NAMESPACE),$(POD_NAMESPACE)":   "agents,agents",
		"$$(POD_NAMESPACE)":                   "$(POD_NAMESPACE)",
		"$(UNKNOWN)/x":                        "$(UNKNOWN)/x",
		"a$(EMPTY)b":                          "ab",
		"cost: $5, open $(":                   "cost: $5, open $(",
		"trailing $":                          "trailing $",
	} {
		if got := ExpandVars(in, vars); got != want {
			t.Errorf("ExpandVars(%q) = %q, want %q", in, got, want)
		}
	}
}

// startSleeper starts a shell (sh) in dir whose child sleeps, and waits until it has started.
func startSleeper(t *testing.T, sh, dir string) *Process {
	t.Helper()
	p, err := Start("sleeper", sh, []string{"-c", "sleep 300 & echo started; wait"}, []string{"PATH=" + os.Getenv("PATH")}, filepath.Join(dir, "sleeper.log"))
	if err != nil {
		t.Fatal(err)
	}
	if err := Poll(t.Context(), 10*time.Second, func() string {
		if !strings.Contains(p.Output(), "started") {
			return "no output yet"
		}
		return ""
	}); err != nil {
		t.Fatal(err)
	}
	return p
}
