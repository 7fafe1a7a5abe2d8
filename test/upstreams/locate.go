package upstreams

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
)

// The Find* functions are the lookups behind Dir, Node and Bin, returning errors instead of
// failing a test, for programs that drive the real servers (hack/bench). Their errors name
// what is missing and how to install it.

// sourceDir is this package's folder (test/upstreams), where ts-client.mjs lives; it is known
// from the compiled source path (so it is not available in a binary built with -trimpath).
func sourceDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("upstreams: cannot locate the source folder of package upstreams")
	}
	return filepath.Dir(file), nil
}

// FindDir returns the absolute path of the node_modules folder holding the packages:
// $REVERSI_UPSTREAMS, or test/upstreams/node_modules. It is an error if the folder does not
// exist.
func FindDir() (string, error) {
	dir := os.Getenv(EnvDir)
	if dir == "" {
		src, err := sourceDir()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(src, "node_modules")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("upstreams: %s: %w", dir, err)
	}
	if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
		if err == nil {
			err = errors.New("not a folder")
		}
		return "", fmt.Errorf("upstreams: %s is not installed (%v); %s", abs, err, installHint)
	}
	return abs, nil
}

// FindNode returns the absolute path of the node binary (Node.js >= 20).
func FindNode() (string, error) {
	path, err := nodeOnce()
	if err != nil {
		return "", fmt.Errorf("upstreams: Node.js is needed for the real MCP servers: %w", err)
	}
	return path, nil
}

// FindBin returns the absolute path of the JavaScript file pkg declares in its package.json
// `bin` (the first one by name when there are several), pkg being installed in FindDir.
func FindBin(pkg string) (string, error) {
	root, err := FindDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, filepath.FromSlash(pkg))
	raw, err := os.ReadFile(filepath.Join(dir, "package.json"))
	if err != nil {
		return "", fmt.Errorf("upstreams: %s is not installed: %v; %s", pkg, err, installHint)
	}
	var meta struct {
		Bin json.RawMessage `json:"bin"`
	}
	if err := json.Unmarshal(raw, &meta); err != nil {
		return "", fmt.Errorf("upstreams: %s/package.json: %w", pkg, err)
	}
	var rel, one string
	var many map[string]string
	switch {
	case json.Unmarshal(meta.Bin, &one) == nil && one != "":
		rel = one
	case json.Unmarshal(meta.Bin, &many) == nil && len(many) > 0:
		first := ""
		for name := range many {
			if first == "" || name < first {
				first = name
			}
		}
		rel = many[first]
	default:
		return "", fmt.Errorf("upstreams: %s/package.json declares no bin", pkg)
	}
	script := filepath.Join(dir, filepath.FromSlash(rel))
	if _, err := os.Stat(script); err != nil {
		return "", fmt.Errorf("upstreams: %s bin %s: %v; %s", pkg, rel, err, installHint)
	}
	return script, nil
}

// MemoryCommand is MemoryAt for programs: the command line of
// @modelcontextprotocol/server-memory (stdio) with its knowledge graph in file
// (MEMORY_FILE_PATH, JSON lines; made absolute).
func MemoryCommand(file string) (cmd string, args []string, env []string, err error) {
	abs, err := filepath.Abs(file)
	if err != nil {
		return "", nil, nil, fmt.Errorf("upstreams: %s: %w", file, err)
	}
	node, err := FindNode()
	if err != nil {
		return "", nil, nil, err
	}
	bin, err := FindBin(MemoryPackage)
	if err != nil {
		return "", nil, nil, err
	}
	return node, []string{bin}, []string{"MEMORY_FILE_PATH=" + abs}, nil
}
