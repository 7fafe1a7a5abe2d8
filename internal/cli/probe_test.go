package cli

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The probe passes only when the gateway process holds every socket listening on its port:
// a listener of this process (the "gateway") passes; the same port also listened on by another
// process (a sidecar with SO_REUSEPORT), or a port only another process listens on, fails with
// ErrPortNotOwned; and the HTTP answer must be 2xx.
func TestProbeRefusesAPortHeldByAnotherProcess(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	status := http.StatusOK
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) }))
	port := ln.Addr().(*net.TCPAddr).Port
	self := os.Getpid()
	if err := portHeldBy(port, self); err != nil {
		t.Fatalf("our own listener: %v", err)
	}
	if code, out, errs := runCLI("probe", "--port", strconv.Itoa(port), "--pid", strconv.Itoa(self), "--path", "/readyz"); code != 0 {
		t.Fatalf("reversi probe on our own healthy listener: exit %d\n%s%s", code, out, errs)
	}
	status = http.StatusServiceUnavailable
	if code, out, errs := runCLI("probe", "--port", strconv.Itoa(port), "--pid", strconv.Itoa(self)); code == 0 || !strings.Contains(out+errs, "503") {
		t.Fatalf("reversi probe on a 503: exit %d %s%s", code, out, errs)
	}
	// The command refuses the port another process holds, naming why.
	other := listenElsewhere(t)
	if code, out, errs := runCLI("probe", "--port", strconv.Itoa(other), "--pid", strconv.Itoa(self)); code == 0 || !strings.Contains(out+errs, "a sidecar took the gateway's port") {
		t.Fatalf("reversi probe on a port another process holds: exit %d %s%s", code, out, errs)
	}

	// Another process takes a port: the probe refuses it whatever the HTTP answer would be.
	if err := portHeldBy(other, self); !errors.Is(err, ErrPortNotOwned) {
		t.Fatalf("a port another process listens on: %v, want ErrPortNotOwned", err)
	}
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freePort := free.Addr().(*net.TCPAddr).Port
	free.Close()
	if err := portHeldBy(freePort, self); !errors.Is(err, ErrPortNotOwned) {
		t.Fatalf("a port nothing listens on: %v, want ErrPortNotOwned", err)
	}
}

// listenElsewhere starts a process (python3) listening on a free port and returns the port.
func listenElsewhere(t *testing.T) int {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 (Debian's package) runs the other listener: %v", err)
	}
	cmd := exec.Command(py, "-c", `import socket,sys,time
s=socket.socket(); s.bind(("127.0.0.1",0)); s.listen(1)
print(s.getsockname()[1], flush=True); time.sleep(60)`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Scan()
		line <- sc.Text()
	}()
	select {
	case l := <-line:
		p, err := strconv.Atoi(strings.TrimSpace(l))
		if err != nil {
			t.Fatalf("the other listener printed %q", l)
		}
		return p
	case <-time.After(10 * time.Second):
		t.Fatal(fmt.Errorf("the other listener did not start"))
	}
	return 0
}
