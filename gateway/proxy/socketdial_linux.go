//go:build linux

package proxy

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// procFD reports whether /proc/self/fd can be dialled through (procfs is mounted).
var procFD = sync.OnceValue(func() bool {
	_, err := os.Stat("/proc/self/fd")
	return err == nil
})

// dialSocketPath connects to the Unix socket that is path itself, never to what a symlink
// there points at: in a ReversiGateway pod the folder of a sidecar's socket is written by the
// server it runs, and a symlink would be resolved in the gateway container, where every other
// upstream's socket is (issue 23). The final component is opened with O_PATH|O_NOFOLLOW, must
// be a socket, and is dialled through /proc/self/fd, so it cannot be swapped between the check
// and the connect. Errors: ENOENT (not there yet), a *NotSocketError, the dial's.
func dialSocketPath(ctx context.Context, d *net.Dialer, path string) (net.Conn, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if err := socketMode(path, st.Mode&unix.S_IFMT); err != nil {
		return nil, err
	}
	target := path
	if procFD() {
		target = "/proc/self/fd/" + strconv.Itoa(fd)
	}
	nc, err := d.DialContext(ctx, "unix", target)
	if oe, ok := errors.AsType[*net.OpError](err); ok && target != path {
		err = &os.PathError{Op: "connect", Path: path, Err: oe.Err}
	}
	return nc, err
}

// socketMode is nil for a socket's file type, else the *NotSocketError of path.
func socketMode(path string, typ uint32) error {
	switch typ {
	case unix.S_IFSOCK:
		return nil
	case unix.S_IFLNK:
		return &NotSocketError{Path: path, What: "a symlink"}
	case unix.S_IFDIR:
		return &NotSocketError{Path: path, What: "a folder"}
	case unix.S_IFREG:
		return &NotSocketError{Path: path, What: "a regular file"}
	}
	return &NotSocketError{Path: path, What: "not a socket"}
}
