//go:build unix && !linux

package stdiobridge

import "syscall"

// sysProcAttr puts a child in its own process group (signals go to what it starts too).
// Outside Linux there is no parent-death signal: a SIGKILLed bridge leaves its children.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// startReaper does nothing outside Linux (no child subreaper).
func (b *bridge) startReaper() (stop func()) { return func() {} }
