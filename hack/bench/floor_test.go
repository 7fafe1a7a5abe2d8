package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRelayLines: every line reaches the writer as it came, the last one without a newline
// too, a line longer than the reader's buffer whole; with a journal, the journal holds the
// same bytes, and checkFloorJournal counts its tools/call lines.
func TestRelayLines(t *testing.T) {
	long := `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"x","arguments":{"s":"` + strings.Repeat("a", 200<<10) + `"}}}`
	in := `{"jsonrpc":"2.0","id":1,"method":"initialize"}` + "\n" +
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"read_graph"}}` + "\n" +
		long + "\n" + `{"jsonrpc":"2.0","id":4,"method":"tools/call"}`
	for _, journal := range []bool{false, true} {
		var out bytes.Buffer
		jfd, file := -1, filepath.Join(t.TempDir(), "journal.jsonl")
		if journal {
			f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			jfd = int(f.Fd())
		}
		if err := relayLines(strings.NewReader(in), &out, jfd); err != nil {
			t.Fatal(err)
		}
		if out.String() != in {
			t.Fatalf("journal %v: relayed %d bytes, want the %d that came in", journal, out.Len(), len(in))
		}
		if !journal {
			continue
		}
		j, err := os.ReadFile(file)
		if err != nil || string(j) != in {
			t.Fatalf("journal holds %d bytes (%v), want the %d relayed", len(j), err, len(in))
		}
		if err := checkFloorJournal(file, 3); err != nil {
			t.Fatal(err)
		}
		if err := checkFloorJournal(file, 2); err == nil {
			t.Fatal("checkFloorJournal must count 3 tools/call lines, not accept 2")
		}
	}
}
