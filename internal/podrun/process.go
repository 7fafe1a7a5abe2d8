// Package podrun runs what a real cluster would run in pods as local processes, on a control
// plane without nodes (envtest): it plays the kubelet for one pod of a Deployment (the Pod
// object made from the template and marked ready, the container's volumes written to local
// folders, its env resolved from the downward API, Secrets and ConfigMaps, a token of its
// ServiceAccount in place of the in-cluster credentials) and starts the container's args as a
// process in its own process group, its output in a log file. It also has the small pieces
// both of its users need around such a process: building the reversi binary, polling with a
// deadline, and an agent's MCP session with an API key.
//
// Its users are the demo (internal/demo: `make demo` and test/e2e/demo) and the red-team
// tests of issue 15 (test/redteam), which run `reversi controller` and `reversi gateway` with
// it; a gateway process runs exactly as the rendered Deployment's container.
package podrun

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// StopTimeout is how long Stop waits after SIGTERM before it sends SIGKILL.
const StopTimeout = 10 * time.Second

// Process is a long-lived child process in its own process group (so that what it starts,
// such as a gateway's stdio upstreams, stops with it), its stdout and stderr in a log file.
type Process struct {
	// Name names it in errors; Path, Args and Env are what it was started with; Log is the
	// file its output goes to.
	Name string
	Path string
	Args []string
	Env  []string
	Log  string

	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
	err  error
}

// Start starts bin with args and exactly env (nothing of this process's environment is
// inherited), appending its output to logPath.
func Start(name, bin string, args, env []string, logPath string) (*Process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, Path: bin, Args: args, Env: env, Log: logPath, cmd: cmd, log: f, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

// PID is the process id (also its process group's id).
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the process has exited, and how (nil: exit status 0).
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM to the process group, waits up to StopTimeout, then sends SIGKILL, and
// returns once the process has exited. Stopping a process that has exited does nothing.
func (p *Process) Stop() {
	if exited, _ := p.Exited(); exited {
		return
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(StopTimeout):
		_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
		<-p.done
	}
}

// Signal sends sig to the process alone (not its group).
func (p *Process) Signal(sig syscall.Signal) error { return syscall.Kill(p.PID(), sig) }

// Wait waits up to timeout for the process to exit, and reports whether it did and how (nil:
// exit status 0).
func (p *Process) Wait(timeout time.Duration) (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	case <-time.After(timeout):
		return false, nil
	}
}

// Output is the log file's content so far.
func (p *Process) Output() string {
	b, _ := os.ReadFile(p.Log)
	return string(b)
}

// Tail is the end of the log, at most n bytes, as valid UTF-8.
func (p *Process) Tail(n int) string { return Tail([]byte(p.Output()), n) }

// PeakRSS is the process's peak resident set size in bytes (VmHWM of /proc/<pid>/status):
// the most memory it has held at once since it started.
func (p *Process) PeakRSS() (int64, error) {
	return statusBytes(p.PID(), "VmHWM")
}

// statusBytes reads a "<field>: <n> kB" line of /proc/<pid>/status.
func statusBytes(pid int, field string) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), field+":")
		if !ok {
			continue
		}
		num, unit, _ := strings.Cut(strings.TrimSpace(rest), " ")
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || unit != "kB" {
			return 0, fmt.Errorf("/proc/%d/status: %s is %q", pid, field, rest)
		}
		return n * 1024, nil
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}

// Tail is the end of b, at most n bytes, as valid UTF-8.
func Tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.ToValidUTF8(b, nil))
}

// BuildCommand is the command that builds the reversi binary at out from the repository at
// root (static, CGO_ENABLED=0, as the image does); run it with Build or print and run it.
func BuildCommand(ctx context.Context, root, out string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, ".")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	return cmd
}

// Build builds the reversi binary at out from the repository at root.
func Build(ctx context.Context, root, out string) error {
	b, err := BuildCommand(ctx, root, out).CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build -o %s .: %w\n%s", out, err, b)
	}
	return nil
}

// Poll calls cond every 50 ms until it returns "" (done) or timeout passes; the error says
// what cond said last.
func Poll(ctx context.Context, timeout time.Duration, cond func() string) error {
	deadline := time.Now().Add(timeout)
	for {
		why := cond()
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %s", timeout, why)
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), errors.New(why))
		case <-time.After(50 * time.Millisecond):
		}
	}
}
