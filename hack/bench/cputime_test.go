package main

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"
)

// spin burns CPU in this process (not sleep) for about d.
func spin(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

// TestCPUTimeCountsThisProcess: spinning raises this process's CPU time as cpuTime reads it.
func TestCPUTimeCountsThisProcess(t *testing.T) {
	self := []int{os.Getpid()}
	before, err := cpuTime(self)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second) // a bound, not a measurement
	for {
		spin(20 * time.Millisecond)
		now, err := cpuTime(self)
		if err != nil {
			t.Fatal(err)
		}
		if now-before >= 50*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time went from %s to %s over 30 s of spinning", before, now)
		}
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{gone.Process.Pid, 1 << 30, 0} { // exited and reaped; no pid; no pid
		if _, err := cpuTime([]int{pid}); err == nil {
			t.Errorf("cpuTime of %d: a process that does not exist must be an error", pid)
		}
	}
}

// TestCPUClockAgreesWithProcTicks: the CPU clock and /proc/<pid>/stat's utime + stime count
// the same time (within a few 10 ms ticks), here over 300 ms of CPU.
func TestCPUClockAgreesWithProcTicks(t *testing.T) {
	self := []int{os.Getpid()}
	c0, err := cpuTime(self)
	if err != nil {
		t.Fatal(err)
	}
	t0, err := ticksTime(self)
	if err != nil {
		t.Fatal(err)
	}
	var c1 time.Duration
	for deadline := time.Now().Add(30 * time.Second); c1-c0 < 300*time.Millisecond; { // bounded
		if time.Now().After(deadline) {
			t.Fatalf("the CPU clock counted %s over 30 s of spinning", c1-c0)
		}
		spin(10 * time.Millisecond)
		c1, _ = cpuTime(self)
	}
	t1, _ := ticksTime(self)
	clock, ticks := c1-c0, t1-t0
	if d := clock - ticks; d < -40*time.Millisecond || d > 40*time.Millisecond {
		t.Fatalf("over the same spin the CPU clock counted %s and /proc ticks %s", clock, ticks)
	}
}

// TestProxyProcesses: the descendants of a root are listed, except an upstream and its own
// children.
func TestProxyProcesses(t *testing.T) {
	start := func(args ...string) *exec.Cmd {
		c := exec.Command(args[0], args[1:]...)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
		return c
	}
	up := start("sh", "-c", "sleep 30; true")    // the "upstream", with a child
	shell := start("sh", "-c", "sleep 31; true") // a helper of the proxy, with a child
	time.Sleep(200 * time.Millisecond)           // let both shells fork their sleeps
	isUp := func(argv []string) bool { return len(argv) == 3 && argv[2] == "sleep 30; true" }
	got, err := proxyProcesses([]int{os.Getpid()}, isUp)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got, os.Getpid()) || !slices.Contains(got, shell.Process.Pid) || slices.Contains(got, up.Process.Pid) {
		t.Fatalf("got %v; want this process %d and the helper %d, not the upstream %d", got, os.Getpid(), shell.Process.Pid, up.Process.Pid)
	}
	var helperChild, upChild bool
	for _, pid := range got {
		f, err := procStat(pid)
		if err != nil {
			continue
		}
		switch f[1] {
		case itoa(shell.Process.Pid):
			helperChild = true
		case itoa(up.Process.Pid):
			upChild = true
		}
	}
	if !helperChild || upChild {
		t.Fatalf("got %v: the helper's sleep listed %v (want true), the upstream's %v (want false)", got, helperChild, upChild)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
