// Package pgtest runs a throwaway PostgreSQL server for tests: initdb in a temporary folder, the
// postgres server on 127.0.0.1 at a free port, stopped and removed at the end. It uses the
// server binaries of the machine (Debian: `apt-get install -y postgresql`, which puts them in
// /usr/lib/postgresql/<version>/bin); when they are missing Start fails with a message saying
// so: a Postgres test never skips. PostgreSQL refuses to run as root, so as root the server
// runs as the `postgres` system user (which the Debian package creates).
//
// One server per test package, from TestMain:
//
//	var pg *pgtest.Server
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, &pg)) }
//
// Source: issue 9 (a test runs PostgreSQL from Debian's packages on 127.0.0.1).
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is a running throwaway PostgreSQL server. Its superuser is "postgres" with trust
// authentication, on 127.0.0.1 only.
type Server struct {
	Port int
	Dir  string // the temporary folder: data/, the socket and server.log
	cmd  *exec.Cmd
	exit chan error // receives the server process's exit
	n    atomic.Int64
}

// Missing is the error text when no server binaries are found.
const Missing = "PostgreSQL server binaries (initdb, postgres) not found in /usr/lib/postgresql/*/bin or $PATH: " +
	"install them (Debian/Ubuntu: apt-get install -y postgresql; .ci/run does it as root)"

// BinDir returns the folder of initdb and postgres: the newest /usr/lib/postgresql/<v>/bin,
// else the folder of initdb on $PATH.
func BinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil && isExec(filepath.Join(filepath.Dir(p), "postgres")) {
		return filepath.Dir(p), nil
	}
	return "", errors.New(Missing)
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// Start initialises a cluster in a new temporary folder and starts the server; it returns once
// the server accepts connections (or fails after 60 s with the server's log).
func Start() (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "reversi-pgtest-")
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: dir}
	ok := false
	defer func() {
		if !ok {
			s.Stop()
		}
	}()
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgtest: PostgreSQL refuses to run as root and there is no postgres user to run it as (%v): install the postgresql package, which creates it", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, fmt.Errorf("pgtest: %w", err)
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres",
		"-E", "UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgtest: initdb: %v\n%s", err, out)
	}
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		err = s.run(bin, data, port, cred)
		if err == nil {
			ok = true
			return s, nil
		}
		if attempt == 2 || !errors.Is(err, errPortTaken) {
			return nil, err
		}
	}
}

var errPortTaken = errors.New("pgtest: port taken")

// run starts postgres on port and waits until it accepts connections.
func (s *Server) run(bin, data string, port int, cred *syscall.Credential) error {
	logPath := filepath.Join(s.Dir, "server.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	if cred != nil {
		_ = logf.Chown(int(cred.Uid), int(cred.Gid))
	}
	// Durable settings (fsync, synchronous_commit) stay at their defaults: the store's
	// guarantees and its benchmark depend on them.
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+s.Dir,
		"-c", "max_connections=300", "-c", "shared_buffers=32MB")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = s.Dir
	// SIGQUIT (immediate shutdown) if the test binary dies without Stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	exit := make(chan error, 1)
	go func() { exit <- cmd.Wait() }()
	s.cmd, s.exit, s.Port = cmd, exit, port
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := pgx.Connect(ctx, s.URL("postgres"))
		if err == nil {
			c.Close(ctx)
			cancel()
			return nil
		}
		cancel()
		select {
		case werr := <-exit:
			s.cmd = nil
			log, _ := os.ReadFile(logPath)
			if strings.Contains(string(log), "Address already in use") {
				return errPortTaken
			}
			return fmt.Errorf("pgtest: postgres exited (%v):\n%s", werr, log)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("pgtest: postgres did not accept connections within 60 s (last: %v):\n%s", err, log)
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// URL returns the connection URL of database db (the cluster has "postgres"; see
// NewDatabase), with extra query parameters params given as name, value pairs.
func (s *Server) URL(db string, params ...string) string {
	q := url.Values{"sslmode": {"disable"}}
	for i := 0; i+1 < len(params); i += 2 {
		q.Set(params[i], params[i+1])
	}
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)),
		Path: "/" + db, RawQuery: q.Encode()}
	return u.String()
}

// NewDatabase creates a new empty database with a unique name and returns its URL.
func (s *Server) NewDatabase(ctx context.Context) (string, error) {
	name := fmt.Sprintf("t%d_%d", os.Getpid(), s.n.Add(1))
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return "", err
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("pgtest: create database: %w", err)
	}
	return s.URL(name), nil
}

// Unique returns a name not returned before by this server (for schemas and databases).
func (s *Server) Unique(prefix string) string {
	return fmt.Sprintf("%s%d", prefix, s.n.Add(1))
}

// Stop shuts the server down (fast shutdown: open sessions are ended) and removes its folder.
func (s *Server) Stop() {
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.exit:
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exit
		}
		s.cmd = nil
	}
	_ = os.RemoveAll(s.Dir)
}

// Main starts a server, stores it in *srv, runs the tests and stops the server. It returns the
// exit code for os.Exit: 1 with a clear message on stderr when the server cannot start.
func Main(m *testing.M, srv **Server) int {
	s, err := Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: cannot start a PostgreSQL server for the tests: %v\n", err)
		return 1
	}
	*srv = s
	defer s.Stop()
	return m.Run()
}

// Lazy starts a server on first use, for packages where only some tests need one; the
// package's TestMain calls Stop after m.Run.
type Lazy struct {
	once sync.Once
	s    *Server
	err  error
}

// Get returns the server, starting it on the first call; it fails t (never skips) when the
// server cannot start.
func (l *Lazy) Get(t testing.TB) *Server {
	t.Helper()
	l.once.Do(func() { l.s, l.err = Start() })
	if l.err != nil {
		t.Fatalf("pgtest: cannot start a PostgreSQL server for this test: %v", l.err)
	}
	return l.s
}

// Stop stops the server if it was started.
func (l *Lazy) Stop() {
	if l.s != nil {
		l.s.Stop()
	}
}
