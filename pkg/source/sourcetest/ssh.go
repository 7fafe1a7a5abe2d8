package sourcetest

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// SSHServer serves the git repositories under Root over SSH on 127.0.0.1: it accepts the
// authorized public keys for any user and runs `git upload-pack` for `git-upload-pack
// '<path>'` exec requests (read only: receive-pack is refused).
type SSHServer struct {
	// Addr is "127.0.0.1:port".
	Addr string
	Root string
	// HostKey is the server's (random ed25519) host key.
	HostKey ssh.PublicKey
	// KnownHosts is a known_hosts line for this server ("[127.0.0.1]:port ssh-ed25519 ...").
	KnownHosts []byte

	config   *ssh.ServerConfig
	listener net.Listener
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
}

// ServeSSH starts an SSH git server for the repositories under root, letting in the holders
// of the authorized keys. It stops at test end.
func ServeSSH(t testing.TB, root string, authorized ...ssh.PublicKey) *SSHServer {
	t.Helper()
	RequireTools(t, "git")
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	hostSigner, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	s := &SSHServer{Root: root, HostKey: hostSigner.PublicKey(), conns: map[net.Conn]struct{}{}}
	s.config = &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			for _, a := range authorized {
				if bytes.Equal(a.Marshal(), key.Marshal()) {
					return &ssh.Permissions{}, nil
				}
			}
			return nil, errors.New("public key not authorized")
		},
	}
	s.config.AddHostKey(hostSigner)
	if s.listener, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	s.Addr = s.listener.Addr().String()
	s.KnownHosts = []byte(knownhosts.Line([]string{knownhosts.Normalize(s.Addr)}, s.HostKey) + "\n")
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(s.close)
	return s
}

// RepoURL is the ssh:// URL (user "git") of the repository at dir, which must be under Root.
func (s *SSHServer) RepoURL(t testing.TB, dir string) string {
	t.Helper()
	rel, err := filepath.Rel(s.Root, dir)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		t.Fatalf("%s is not under the served root %s", dir, s.Root)
	}
	return "ssh://git@" + s.Addr + "/" + filepath.ToSlash(rel)
}

func (s *SSHServer) close() {
	_ = s.listener.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *SSHServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.listener.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			_ = c.Close()
		}()
	}
}

func (s *SSHServer) serveConn(c net.Conn) {
	conn, chans, reqs, err := ssh.NewServerConn(c, s.config)
	if err != nil {
		return // handshake or authentication failed
	}
	defer conn.Close()
	go ssh.DiscardRequests(reqs)
	var sessions sync.WaitGroup
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "only sessions")
			continue
		}
		ch, chReqs, err := nc.Accept()
		if err != nil {
			continue
		}
		sessions.Add(1)
		go func() {
			defer sessions.Done()
			s.serveSession(ch, chReqs)
		}()
	}
	sessions.Wait()
}

func (s *SSHServer) serveSession(ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
	for req := range reqs {
		switch req.Type {
		case "env":
			_ = req.Reply(true, nil)
		case "exec":
			var payload struct{ Command string }
			if err := ssh.Unmarshal(req.Payload, &payload); err != nil {
				_ = req.Reply(false, nil)
				return
			}
			cmd, err := s.command(payload.Command)
			if err != nil {
				_ = req.Reply(true, nil)
				fmt.Fprintf(ch.Stderr(), "fatal: %v\n", err)
				exit(ch, 128)
				return
			}
			_ = req.Reply(true, nil)
			exit(ch, run(cmd, ch))
			return
		default:
			_ = req.Reply(false, nil)
		}
	}
}

// command maps "git-upload-pack '/path'" to `git upload-pack <Root>/path`.
func (s *SSHServer) command(line string) (*exec.Cmd, error) {
	prog, arg, ok := strings.Cut(line, " ")
	if !ok || (prog != "git-upload-pack" && prog != "git upload-pack") {
		return nil, fmt.Errorf("only git-upload-pack is served, not %q", line)
	}
	arg = strings.Trim(strings.TrimSpace(arg), "'")
	dir := filepath.Join(s.Root, filepath.FromSlash(strings.TrimPrefix(arg, "/")))
	if rel, err := filepath.Rel(s.Root, dir); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, fmt.Errorf("'%s' does not appear to be a git repository", arg)
	}
	cmd := exec.Command("git", "upload-pack", dir)
	cmd.Env = gitEnv(s.Root)
	return cmd, nil
}

// run runs cmd with the channel as its stdin, stdout and stderr and returns its exit code.
func run(cmd *exec.Cmd, ch ssh.Channel) int {
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 128
	}
	cmd.Stdout, cmd.Stderr = ch, ch.Stderr()
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(ch.Stderr(), "fatal: %v\n", err)
		return 128
	}
	// Not waited for: it ends when the client closes its side or the channel closes.
	go func() {
		_, _ = io.Copy(stdin, ch)
		_ = stdin.Close()
	}()
	if err := cmd.Wait(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		return 128
	}
	return 0
}

func exit(ch ssh.Channel, code int) {
	_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(code)}))
}
