package source

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"path"
	"sort"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// FS is the fetched commit's files read from the git objects into memory (works with
// ObjectsOnly, where nothing is checked out). Symbolic links and submodules are listed with
// fs.ModeSymlink and hold their target's name, never its content: a repository cannot make a
// reader read outside itself. Safe for concurrent readers.
func (a *Artifact) FS() (fs.FS, error) {
	if a == nil || a.repo == nil {
		return nil, errors.New("the artifact was cleaned up")
	}
	c, err := a.repo.CommitObject(plumbing.NewHash(a.Commit))
	if err != nil {
		return nil, err
	}
	tree, err := c.Tree()
	if err != nil {
		return nil, err
	}
	// Reading every blob once, in tree order, is far cheaper than a checkout or than decoding
	// trees per Open.
	files := memFS{}
	walker := object.NewTreeWalker(tree, true, nil)
	defer walker.Close()
	for {
		name, entry, err := walker.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		switch entry.Mode {
		case filemode.Dir:
			files.add(name, nil, fs.ModeDir|0o555, c.Committer.When)
		case filemode.Regular, filemode.Executable, filemode.Deprecated:
			blob, err := a.repo.BlobObject(entry.Hash)
			if err != nil {
				return nil, err
			}
			r, err := blob.Reader()
			if err != nil {
				return nil, err
			}
			data, err := io.ReadAll(r)
			r.Close()
			if err != nil {
				return nil, err
			}
			files.add(name, data, 0o444, c.Committer.When)
		default: // symlink or submodule: recorded, never resolved
			files.add(name, nil, fs.ModeSymlink|0o444, c.Committer.When)
		}
	}
	files.sort()
	return files, nil
}

// memFS is a read-only in-memory file tree: each folder keeps its entries, so listing a folder
// costs its own size (fstest.MapFS scans every file per listing, quadratic for 5,000 folders).
type memFS map[string]*memNode

type memNode struct {
	info     memInfo
	data     []byte
	children []fs.DirEntry // folders only, sorted by name
}

type memInfo struct {
	name string
	size int64
	mode fs.FileMode
	when time.Time
}

func (i memInfo) Name() string       { return i.name }
func (i memInfo) Size() int64        { return i.size }
func (i memInfo) Mode() fs.FileMode  { return i.mode }
func (i memInfo) ModTime() time.Time { return i.when }
func (i memInfo) IsDir() bool        { return i.mode.IsDir() }
func (i memInfo) Sys() any           { return nil }

// add records a file or folder; the tree walker yields parents before children.
func (m memFS) add(name string, data []byte, mode fs.FileMode, when time.Time) {
	if len(m) == 0 {
		m["."] = &memNode{info: memInfo{name: ".", mode: fs.ModeDir | 0o555, when: when}}
	}
	n := &memNode{info: memInfo{name: path.Base(name), size: int64(len(data)), mode: mode, when: when}, data: data}
	m[name] = n
	if parent := m[path.Dir(name)]; parent != nil {
		parent.children = append(parent.children, fs.FileInfoToDirEntry(n.info))
	}
}

func (m memFS) sort() {
	for _, n := range m {
		sort.Slice(n.children, func(i, j int) bool { return n.children[i].Name() < n.children[j].Name() })
	}
}

// Open implements fs.FS.
func (m memFS) Open(name string) (fs.File, error) {
	n, err := m.node("open", name)
	if err != nil {
		return nil, err
	}
	return &memFile{node: n, Reader: bytes.NewReader(n.data)}, nil
}

// ReadFile implements fs.ReadFileFS.
func (m memFS) ReadFile(name string) ([]byte, error) {
	n, err := m.node("read", name)
	if err != nil {
		return nil, err
	}
	if n.info.IsDir() {
		return nil, &fs.PathError{Op: "read", Path: name, Err: errors.New("is a directory")}
	}
	return bytes.Clone(n.data), nil
}

// ReadDir implements fs.ReadDirFS.
func (m memFS) ReadDir(name string) ([]fs.DirEntry, error) {
	n, err := m.node("readdir", name)
	if err != nil {
		return nil, err
	}
	if !n.info.IsDir() {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: errors.New("not a directory")}
	}
	return append([]fs.DirEntry(nil), n.children...), nil
}

// Stat implements fs.StatFS.
func (m memFS) Stat(name string) (fs.FileInfo, error) {
	n, err := m.node("stat", name)
	if err != nil {
		return nil, err
	}
	return n.info, nil
}

func (m memFS) node(op, name string) (*memNode, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	n := m[name]
	if n == nil {
		return nil, &fs.PathError{Op: op, Path: name, Err: fs.ErrNotExist}
	}
	return n, nil
}

type memFile struct {
	node *memNode
	*bytes.Reader
	next int // entries already returned by ReadDir
}

func (f *memFile) Stat() (fs.FileInfo, error) { return f.node.info, nil }
func (f *memFile) Close() error               { return nil }

// ReadDir implements fs.ReadDirFile for folders: n > 0 returns at most n entries per call
// (io.EOF at the end), n <= 0 all that remain.
func (f *memFile) ReadDir(n int) ([]fs.DirEntry, error) {
	rest := f.node.children[f.next:]
	if n > 0 && len(rest) == 0 {
		return nil, io.EOF
	}
	if n > 0 && n < len(rest) {
		rest = rest[:n]
	}
	f.next += len(rest)
	return append([]fs.DirEntry(nil), rest...), nil
}
