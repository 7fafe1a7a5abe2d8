package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"

	"golang.org/x/sys/unix"
)

// floorMain is the hidden subcommand `floor [-journal FILE] -- server args...`, the bench's
// yardstick (issue 20): the least a stdio MCP proxy can do. It starts the server and relays
// bytes: every line from stdin to the server's stdin (one write per line), and the server's
// stdout to stdout as it comes. With -journal it first appends each line to FILE (opened with
// O_APPEND, so several relays can share it) and fdatasyncs it, then forwards the line: the
// cost of a durable intent with nothing else. It decodes nothing.
func floorMain(argv []string) error {
	fs := flag.NewFlagSet("floor", flag.ContinueOnError)
	journal := fs.String("journal", "", "append every line from stdin to this file and fdatasync it before forwarding the line (empty: no journal)")
	if err := fs.Parse(argv); err != nil {
		return err
	}
	args := fs.Args()
	if len(args) == 0 {
		return errors.New("floor: give the server's command line after --")
	}
	jfd := -1
	if *journal != "" {
		jf, err := os.OpenFile(*journal, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		defer jf.Close()
		jfd = int(jf.Fd())
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stderr = os.Stderr
	up, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	down, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	copied := make(chan error, 1)
	go func() {
		_, err := io.CopyBuffer(os.Stdout, down, make([]byte, 64<<10))
		copied <- err
	}()
	relayErr := relayLines(os.Stdin, up, jfd)
	_ = up.Close() // EOF to the server, which then exits
	werr := cmd.Wait()
	cerr := <-copied
	return errors.Join(relayErr, cerr, werr)
}

// relayLines copies r to w one line at a time (a write per line); with jfd ≥ 0 each line is
// first written to the file jfd and fdatasynced. It returns at r's EOF (nil) or on an error.
func relayLines(r io.Reader, w io.Writer, jfd int) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var long []byte // a line longer than the reader's buffer, assembled
	for {
		chunk, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long, chunk...)
			continue
		}
		line := chunk
		if long != nil {
			line = append(long, chunk...)
			long = nil
		}
		if len(line) > 0 {
			if jfd >= 0 {
				if err := writeAll(jfd, line); err != nil {
					return fmt.Errorf("journal: %w", err)
				}
				if err := unix.Fdatasync(jfd); err != nil {
					return fmt.Errorf("journal: fdatasync: %w", err)
				}
			}
			if _, err := w.Write(line); err != nil {
				return err
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// writeAll writes b to the file descriptor fd (one write(2) unless it is cut short).
func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		b = b[n:]
	}
	return nil
}

// checkFloorJournal checks that the floor's journal holds want lines of tools/call requests
// (and each line one whole JSON-RPC message).
func checkFloorJournal(file string, want int) error {
	fh, err := os.Open(file)
	if err != nil {
		return err
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	calls := 0
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("{")) || !bytes.HasSuffix(line, []byte("}")) {
			return fmt.Errorf("floor journal %s: a line is not one JSON message: %.80q", file, line)
		}
		if bytes.Contains(line, []byte(`"method":"tools/call"`)) {
			calls++
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if calls != want {
		return fmt.Errorf("floor journal %s: %d tools/call lines, want %d", file, calls, want)
	}
	return nil
}
