package upstreams

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/test/syncbuf"
)

// Bounds of StartEverythingHTTP.
const (
	// everythingStartTimeout bounds the wait for the server to listen and answer.
	everythingStartTimeout = 20 * time.Second
	// everythingStopTimeout is how long the server gets to exit on SIGTERM before SIGKILL.
	everythingStopTimeout = 5 * time.Second
)

// EverythingServer is one @modelcontextprotocol/server-everything process serving MCP over
// Streamable HTTP on 127.0.0.1, started by StartEverythingHTTP and killed (with its whole
// process group) when the test ends.
type EverythingServer struct {
	// URL is the MCP endpoint, http://127.0.0.1:<port>/mcp.
	URL string
	// Pid is the server's process id (also its process group id).
	Pid int

	record string
	stderr *syncbuf.Buffer
}

// HTTPMessage is one JSON-RPC message a server started by StartEverythingHTTP received in a
// POST body, in arrival order.
type HTTPMessage struct {
	// Session is the Mcp-Session-Id header of the POST; empty for initialize.
	Session string
	// ID is the request id as sent (a JSON number or string); empty for a notification.
	ID json.RawMessage
	// Method is the JSON-RPC method; empty for a response (to a server-to-client request).
	Method string
	// Params are the message's params, as sent; empty when absent.
	Params json.RawMessage
}

// EverythingHTTP starts server-everything over Streamable HTTP (see StartEverythingHTTP) and
// returns its MCP endpoint URL, http://127.0.0.1:<port>/mcp.
func EverythingHTTP(t testing.TB) (url string) {
	t.Helper()
	return StartEverythingHTTP(t).URL
}

// StartEverythingHTTP starts @modelcontextprotocol/server-everything with its streamableHttp
// transport, one MCP session (and server state) per client session. The server calls
// app.listen(PORT), which binds every interface; loopback.mjs (a Node preload) binds it to
// 127.0.0.1 instead, and PORT=0 lets the kernel pick a free port (no race with other tests).
// The function fails the test unless, within 20 s, the server listens on 127.0.0.1 only (checked
// again in /proc/net/tcp and tcp6) and answers HTTP on /mcp. Every JSON-RPC message the server
// receives is recorded (see Received). When the test ends the process group gets SIGTERM, then
// SIGKILL after 5 s.
func StartEverythingHTTP(t testing.TB) *EverythingServer {
	t.Helper()
	dir := t.TempDir()
	s := &EverythingServer{record: filepath.Join(dir, "received.jsonl"), stderr: &syncbuf.Buffer{}}
	cmd := exec.Command(Node(t), Bin(t, EverythingPackage), "streamableHttp")
	cmd.Dir = dir
	cmd.Env = []string{
		"PORT=0",
		"NODE_OPTIONS=--import=" + filepath.Join(srcDir(t), "loopback.mjs"),
		"REVERSI_RECORD_HTTP=" + s.record,
	}
	cmd.Stdout = io.Discard // one line per HTTP request
	cmd.Stderr = s.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("upstreams: start server-everything (streamableHttp): %v", err)
	}
	s.Pid = cmd.Process.Pid
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { stopGroup(s.Pid, done) })

	port, err := waitListening(s.stderr, done, everythingStartTimeout)
	if err != nil {
		t.Fatalf("upstreams: server-everything (streamableHttp): %v\nstderr:\n%s", err, s.stderr)
	}
	if err := onlyLoopback(port); err != nil {
		t.Fatalf("upstreams: server-everything (streamableHttp): %v", err)
	}
	s.URL = fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	if err := waitAnswering(s.URL, done, everythingStartTimeout); err != nil {
		t.Fatalf("upstreams: server-everything at %s: %v\nstderr:\n%s", s.URL, err, s.stderr)
	}
	return s
}

// Stderr returns what the server wrote to stderr so far (for failure messages).
func (s *EverythingServer) Stderr() string { return s.stderr.String() }

// Received returns every JSON-RPC message the server has received so far, in arrival order.
func (s *EverythingServer) Received(t testing.TB) []HTTPMessage {
	t.Helper()
	data, err := os.ReadFile(s.record)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []HTTPMessage
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		var rec struct {
			Session string `json:"session"`
			Message struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
				Params json.RawMessage `json:"params"`
			} `json:"message"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("upstreams: %s: %q: %v", s.record, line, err)
		}
		out = append(out, HTTPMessage{Session: rec.Session, ID: rec.Message.ID, Method: rec.Message.Method, Params: rec.Message.Params})
	}
	return out
}

var listeningLine = regexp.MustCompile(`reversi-loopback: listening on 127\.0\.0\.1:(\d+)\n`)

// waitListening waits for loopback.mjs's line on stderr and returns the port it names.
func waitListening(stderr *syncbuf.Buffer, done <-chan struct{}, within time.Duration) (int, error) {
	deadline := time.After(within)
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		if m := listeningLine.FindStringSubmatch(stderr.String()); m != nil {
			return strconv.Atoi(m[1])
		}
		select {
		case <-done:
			return 0, errors.New("exited before listening")
		case <-deadline:
			return 0, fmt.Errorf("did not listen within %s", within)
		case <-tick.C:
		}
	}
}

// onlyLoopback checks in /proc/net/tcp and /proc/net/tcp6 that every socket listening on port
// is bound to 127.0.0.1 (0100007F), and that there is one.
func onlyLoopback(port int) error {
	want := fmt.Sprintf(":%04X", port)
	found := 0
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			return fmt.Errorf("cannot check the bound address: %w", err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			// sl local_address rem_address st ...; st 0A is LISTEN.
			if len(fields) < 4 || fields[3] != "0A" || !strings.HasSuffix(fields[1], want) {
				continue
			}
			if fields[1] != "0100007F"+want {
				f.Close()
				return fmt.Errorf("port %d is listening on %s (%s), not only 127.0.0.1", port, fields[1], table)
			}
			found++
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", table, err)
		}
	}
	if found == 0 {
		return fmt.Errorf("no socket is listening on port %d", port)
	}
	return nil
}

// waitAnswering waits until a GET on url without a session gets the server's own answer
// (400 "No valid session ID").
func waitAnswering(url string, done <-chan struct{}, within time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	end := time.Now().Add(within)
	var last error
	for time.Now().Before(end) {
		res, err := hc.Get(url)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
			_ = res.Body.Close()
			if res.StatusCode == http.StatusBadRequest && strings.Contains(string(body), "No valid session ID") {
				return nil
			}
			err = fmt.Errorf("GET: %d %q", res.StatusCode, body)
		}
		last = err
		select {
		case <-done:
			return errors.New("exited")
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("did not answer within %s: %v", within, last)
}

// stopGroup ends the process group pgid: SIGTERM, then SIGKILL after everythingStopTimeout or
// once the leader has exited (so no child of it is left either).
func stopGroup(pgid int, done <-chan struct{}) {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(everythingStopTimeout):
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-done
}
