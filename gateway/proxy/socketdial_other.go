//go:build !linux

package proxy

import (
	"context"
	"io/fs"
	"net"
	"os"
)

// dialSocketPath connects to the Unix socket that is path itself (see the Linux version): the
// path is checked with Lstat first. Without O_PATH the check and the connect are two steps.
func dialSocketPath(ctx context.Context, d *net.Dialer, path string) (net.Conn, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	switch m := fi.Mode(); {
	case m&fs.ModeSymlink != 0:
		return nil, &NotSocketError{Path: path, What: "a symlink"}
	case m&fs.ModeSocket == 0:
		return nil, &NotSocketError{Path: path, What: "not a socket"}
	}
	return d.DialContext(ctx, "unix", path)
}
