//go:build unix

package stdiobridge

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// child is one server process: its own process group, its stdin and stdout pipes.
type child struct {
	pid     int
	cmd     *exec.Cmd
	stdin   *os.File // the write end
	stdout  *os.File // the read end
	started time.Time
	done    chan struct{} // closed once it was waited for (cmd.ProcessState is set)
}

// startChild starts the server (from the spawner's thread, see spawner) and registers it for
// signal forwarding; a signal that came while it started is sent to it.
func (b *bridge) startChild() (*child, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		_, _ = inR.Close(), inW.Close()
		return nil, err
	}
	cmd := exec.Command(b.o.Command[0], b.o.Command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, b.o.Log
	cmd.SysProcAttr = sysProcAttr()
	cmd.WaitDelay = StopWait // a process it left holding stderr must not hold Wait
	b.spawnMu.Lock()         // until it is registered: the reaper must not wait for it
	err = b.spawn.start(cmd)
	_, _ = inR.Close(), outW.Close()
	if err != nil {
		b.spawnMu.Unlock()
		_, _ = inW.Close(), outR.Close()
		return nil, err
	}
	c := &child{pid: cmd.Process.Pid, cmd: cmd, stdin: inW, stdout: outR, started: time.Now(), done: make(chan struct{})}
	b.mu.Lock()
	b.children[c] = struct{}{}
	if b.stopping {
		c.signal(b.stopSig)
	}
	b.mu.Unlock()
	b.spawnMu.Unlock()
	b.logf("started the server (pid %d): %s", c.pid, strings.Join(b.o.Command, " "))
	go func() {
		_ = cmd.Wait()
		// What the server started stops with it: its process group gets SIGKILL (the group
		// outlives its leader while a member lives; empty, the kill finds nothing).
		_ = syscall.Kill(-c.pid, syscall.SIGKILL)
		b.mu.Lock()
		delete(b.children, c)
		b.mu.Unlock()
		close(c.done)
	}()
	return c, nil
}

// signal sends sig to the child's process group.
func (c *child) signal(sig syscall.Signal) {
	_ = syscall.Kill(-c.pid, sig)
}

// status is the exit status of a child that has exited: its exit code, or 128+n when signal
// n ended it (as a shell reports it).
func (c *child) status() int {
	ps := c.cmd.ProcessState
	if ps == nil {
		return 0
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// state says how a child that has exited ended ("exit status 1", "signal: killed").
func (c *child) state() string {
	if c.cmd.ProcessState == nil {
		return "running"
	}
	return c.cmd.ProcessState.String()
}

// spawner starts children from one goroutine locked to its OS thread for the bridge's whole
// run. On Linux a child's parent-death signal (Pdeathsig) fires when the *thread* that
// started it ends, and the Go runtime may end idle threads: starting every child from a
// thread that lives as long as the bridge makes the signal mean "the bridge died".
type spawner struct {
	reqs chan spawnReq
}

type spawnReq struct {
	cmd *exec.Cmd
	err chan error
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan spawnReq)}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine, after the last child
		for r := range s.reqs {
			r.err <- r.cmd.Start()
		}
	}()
	return s
}

func (s *spawner) start(cmd *exec.Cmd) error {
	r := spawnReq{cmd: cmd, err: make(chan error, 1)}
	s.reqs <- r
	if err := <-r.err; err != nil {
		return fmt.Errorf("starting %s: %w", cmd.Path, err)
	}
	return nil
}

// close ends the spawner's goroutine (and its thread); call it once no child is running.
func (s *spawner) close() { close(s.reqs) }
