package stdiobridge

import "syscall"

// sysProcAttr puts a child in its own process group (signals go to what it starts too) and
// gives it SIGKILL when the bridge dies (Pdeathsig; see spawner).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
