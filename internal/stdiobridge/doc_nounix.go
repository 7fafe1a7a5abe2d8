//go:build !unix

// Package stdiobridge is `reversi stdio-bridge`; it needs a Unix system (process groups, Unix
// sockets, signals).
package stdiobridge

import (
	"context"
	"errors"
	"io"
	"os"
	"time"
)

const (
	SessionShared         = "shared"
	SessionPerClient      = "per_client"
	DefaultMaxConnections = 32
	DefaultGracePeriod    = 10 * time.Second
)

// Options are as on Unix.
type Options struct {
	Listen, Session string
	MaxConnections  int
	GracePeriod     time.Duration
	Command         []string
	Log             io.Writer
	Signals         <-chan os.Signal
}

// Run fails: the bridge needs a Unix system.
func Run(context.Context, Options) (int, error) {
	return 0, errors.New("reversi stdio-bridge needs Linux or another Unix system")
}
