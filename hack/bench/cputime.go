package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cpuTime is the CPU time (user + system, all threads, exited ones included) the processes
// pids have used so far, each read from its kernel CPU-time clock: clock_gettime on the
// process clock of its pid (CPUCLOCK_SCHED, nanoseconds). /proc/<pid>/stat's utime + stime
// are the same time split and rounded to 10 ms ticks, too coarse for a relay that spends
// 50 µs a call; ticksTime reads those, and the test checks that the two agree.
func cpuTime(pids []int) (time.Duration, error) {
	var total time.Duration
	for _, pid := range pids {
		if pid <= 0 || pid > 1<<22 { // PID_MAX_LIMIT; beyond it the clock id would wrap
			return 0, fmt.Errorf("CPU clock of process %d: not a pid", pid)
		}
		var ts unix.Timespec
		// The clock id of a process's CPU clock (clock_getcpuclockid(3)): ~pid << 3 | SCHED.
		if err := unix.ClockGettime(int32(^pid<<3|2), &ts); err != nil {
			return 0, fmt.Errorf("CPU clock of process %d: %w", pid, err)
		}
		total += time.Duration(ts.Nano())
	}
	return total, nil
}

// ticksTime is utime + stime of the processes pids from /proc/<pid>/stat (clock ticks of
// 10 ms).
func ticksTime(pids []int) (time.Duration, error) {
	var total time.Duration
	for _, pid := range pids {
		f, err := procStat(pid)
		if err != nil {
			return 0, err
		}
		if len(f) < 13 {
			return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
		}
		for _, s := range f[11:13] { // utime, stime
			ticks, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
			}
			total += time.Duration(ticks) * 10 * time.Millisecond // USER_HZ is 100 on Linux
		}
	}
	return total, nil
}

// procStat returns the fields of /proc/<pid>/stat after the command name (which is in
// parentheses and may hold spaces): [0] is the state, [1] the parent pid, [11] utime, [12]
// stime.
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	return strings.Fields(string(b[i+1:])), nil
}

// procArgs is a process's command line from /proc/<pid>/cmdline.
func procArgs(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// proxyProcesses returns roots and all their descendants (from the parent pids in /proc),
// except the processes for which upstream(argv) is true, and their descendants: the proxy's
// own processes, not the servers it fronts.
func proxyProcesses(roots []int, upstream func(argv []string) bool) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	children := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := procStat(pid)
		if err != nil || len(f) < 2 {
			continue // exited meanwhile
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			children[ppid] = append(children[ppid], pid)
		}
	}
	var out []int
	var walk func(pid int)
	walk = func(pid int) {
		out = append(out, pid)
		for _, c := range children[pid] {
			if !upstream(procArgs(c)) {
				walk(c)
			}
		}
	}
	for _, r := range roots {
		walk(r)
	}
	return out, nil
}

// loadAverage is the 1-minute load average from /proc/loadavg (0 when unreadable).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
