package upstreams

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Hostile returns the path of the hostile MCP server (test/upstreams/hostile, a Go program that
// misbehaves on purpose; its flags choose the faults, see its package comment), built with the
// go command on first use. It fails the test if it cannot be built.
func Hostile(t testing.TB) string {
	t.Helper()
	bin, err := BuildHostile()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

var hostileOnce = sync.OnceValues(func() (string, error) { return buildProgram("hostile") })

// BuildHostile is Hostile for programs (hack/bench): it returns the binary's path or why it
// could not be built. The binary is kept in the system's temporary folder under a name holding
// the hash of its source, so test processes share one build and a changed source builds anew.
func BuildHostile() (string, error) { return hostileOnce() }

// Tools returns the path of the tools MCP server (test/upstreams/tools: go-sdk, its tools
// named on its command line, each answering its arguments), built on first use like Hostile.
func Tools(t testing.TB) string {
	t.Helper()
	bin, err := toolsOnce()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

var toolsOnce = sync.OnceValues(func() (string, error) { return buildProgram("tools") })

// buildProgram builds the program in the folder name beside this file into the system's
// temporary folder, named by the hash of its main.go, unless that build is there already.
func buildProgram(name string) (string, error) {
	dir, err := sourceDir()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(dir, name, "main.go"))
	if err != nil {
		return "", fmt.Errorf("upstreams: the %s server's source: %w", name, err)
	}
	sum := sha256.Sum256(b)
	out := filepath.Join(os.TempDir(), "reversi-"+name+"-"+hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	// Build beside the final name, then rename: concurrent test processes never see half a file.
	tmp, err := os.CreateTemp(os.TempDir(), "reversi-"+name+"-build-")
	if err != nil {
		return "", err
	}
	_ = tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command("go", "build", "-o", tmp.Name(), "./"+name)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("upstreams: go build ./test/upstreams/%s: %v\n%s", name, err, b)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", err
	}
	return out, nil
}
