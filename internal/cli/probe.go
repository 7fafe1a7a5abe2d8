package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

func init() { register(newProbeCmd) }

// newProbeCmd is `reversi probe`: the exec probe of a gateway container whose pod runs
// container upstreams (issue 23). Sidecars share the pod's network namespace and start first,
// so a server image could listen on the gateway's port before the gateway does and answer an
// HTTP probe (and the Service's traffic) in its place. The probe first checks that every
// socket listening on the port is one the gateway process (PID 1 of its container) holds, then
// asks the gateway's /healthz or /readyz on 127.0.0.1.
func newProbeCmd() *cobra.Command {
	var port, pid int
	var path string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "probe --port PORT --path /readyz",
		Short: "Probe the gateway of this container: its port is held by the gateway alone, and PATH answers 2xx",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if port <= 0 || port > 65535 {
				return fmt.Errorf("--port %d: give the gateway's port (1-65535)", port)
			}
			if err := portHeldBy(port, pid); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+path, nil)
			if err != nil {
				return fmt.Errorf("--path %q: %w", path, err)
			}
			resp, err := (&http.Client{Transport: &http.Transport{Proxy: nil}}).Do(req)
			if err != nil {
				return fmt.Errorf("GET %s: %w", req.URL, err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			if resp.StatusCode/100 != 2 {
				return fmt.Errorf("GET %s: %s: %s", req.URL, resp.Status, strings.TrimSpace(string(body)))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&port, "port", 0, "the gateway's port")
	f.StringVar(&path, "path", "/readyz", "the endpoint to ask (/healthz or /readyz)")
	f.IntVar(&pid, "pid", 1, "the gateway's process (PID 1 of its container)")
	f.DurationVar(&timeout, "timeout", 2*time.Second, "how long the HTTP request may take")
	return cmd
}

// ErrPortNotOwned is returned by portHeldBy when another process listens on the port, or
// nothing does.
var ErrPortNotOwned = errors.New("the gateway's port is not held by the gateway alone")

// portHeldBy checks, from /proc/net/tcp and tcp6 of this network namespace and the open files
// of pid, that at least one socket listens on port and that pid holds every one of them.
// Errors: ErrPortNotOwned (naming the sockets), or a /proc file that cannot be read.
func portHeldBy(port, pid int) error {
	listening, err := listeningInodes(port)
	if err != nil {
		return err
	}
	if len(listening) == 0 {
		return fmt.Errorf("%w: nothing listens on port %d", ErrPortNotOwned, port)
	}
	held, err := socketInodes(pid)
	if err != nil {
		return err
	}
	var foreign []string
	for _, ino := range listening {
		if !held[ino] {
			foreign = append(foreign, "socket:["+ino+"]")
		}
	}
	if len(foreign) > 0 {
		return fmt.Errorf("%w: port %d is also listened on by %s, which process %d does not hold (a sidecar took the gateway's port?)", ErrPortNotOwned, port, strings.Join(foreign, ", "), pid)
	}
	return nil
}

// listeningInodes are the inodes of the TCP sockets in state LISTEN on port (IPv4 and IPv6).
func listeningInodes(port int) ([]string, error) {
	var out []string
	want := fmt.Sprintf(":%04X", port)
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(file)
		if errors.Is(err, os.ErrNotExist) {
			continue // no IPv6
		}
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			if len(fields) < 10 || fields[3] != "0A" || !strings.HasSuffix(fields[1], want) {
				continue
			}
			out = append(out, fields[9])
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", file, err)
		}
	}
	return out, nil
}

// socketInodes are the inodes of the sockets pid holds open (its fd links "socket:[N]").
func socketInodes(pid int) (map[string]bool, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading the gateway's open files (%s): %w", dir, err)
	}
	held := map[string]bool{}
	for _, e := range entries {
		link, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			held[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	return held, nil
}
