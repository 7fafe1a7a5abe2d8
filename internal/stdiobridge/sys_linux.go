package stdiobridge

import (
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// sysProcAttr puts a child in its own process group (signals go to what it starts too) and
// gives it SIGKILL when the bridge dies (Pdeathsig; see spawner).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// startReaper makes the bridge a child subreaper and reaps the orphans that then come to it:
// processes a server started and left behind when it exited (npx starts sh, which starts
// node). The bridge is usually PID 1 of its container, where they come anyway; unreaped they
// stay zombies for the container's life. Only processes that are not the bridge's own children
// (registered in b.children under b.spawnMu) are reaped: those are exec.Cmd's to wait for.
func (b *bridge) startReaper() (stop func()) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		b.logf("cannot become a child subreaper (%v): orphans of the server are not reaped", err)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		tick := time.NewTicker(time.Second) // a SIGCHLD while an own child was first in line
		defer tick.Stop()
		for {
			select {
			case <-sigs:
			case <-tick.C:
			case <-done:
				return
			}
			b.reapOrphans()
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
		<-ended
	}
}

// reapOrphans waits for every exited process whose parent is the bridge and that is not one
// of its children.
func (b *bridge) reapOrphans() {
	self := os.Getpid()
	b.spawnMu.Lock()
	defer b.spawnMu.Unlock()
	own := map[int]bool{}
	b.mu.Lock()
	for c := range b.children {
		own[c.pid] = true
	}
	b.mu.Unlock()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || own[pid] {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses, so read after the last ')'.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 2 || f[0] != "Z" || f[1] != strconv.Itoa(self) {
			continue
		}
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); err == nil {
			b.logf("reaped process %d, left behind by the server (%s)", pid, exitText(ws))
		}
	}
}

func exitText(ws syscall.WaitStatus) string {
	if ws.Signaled() {
		return "signal: " + ws.Signal().String()
	}
	return "exit status " + strconv.Itoa(ws.ExitStatus())
}
