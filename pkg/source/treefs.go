package source

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// FS is the files of the fetched commit under Options.Path, read from the git objects into
// memory, with the folders that lead to Path (and nothing else of the tree). Symbolic links
// and submodules are listed with fs.ModeSymlink and hold their target's name, never its
// content: a repository cannot make a reader read outside itself. When Path does not name a
// folder of the commit the FS holds only ".". Safe for concurrent readers.
//
// Every entry read under Path (file, folder, symbolic link, submodule; the folders leading
// to Path too) is counted against MaxFiles and charged against MaxTotalBytes before
// anything is allocated for it: 256 bytes plus the length of its path, plus, for a file,
// its content. Each blob's size is read from its object header and checked against
// MaxFileBytes before the blob is read. So a commit cannot make FS hold more than about
// MaxTotalBytes, however many empty files or folders (or copies of one tree) it has. Errors
// are *Error: ErrTooLarge naming the file and the limit (also for a blob under Path that is
// absent because the server's filter left it out for its size), or ErrFetchFailed.
func (a *Artifact) FS() (fs.FS, error) {
	if a == nil || a.store == nil {
		return nil, &Error{Op: "read", Kind: ErrInvalidOptions, Err: errors.New("the artifact was cleaned up")}
	}
	files, err := a.readTree()
	if err != nil {
		var se *Error
		if errors.As(err, &se) {
			return nil, err
		}
		return nil, &Error{Op: "read", Subject: a.Revision, Kind: ErrFetchFailed, Err: err}
	}
	return files, nil
}

func (a *Artifact) readTree() (memFS, error) {
	c, err := object.GetCommit(a.store, plumbing.NewHash(a.Commit))
	if err != nil {
		return nil, err
	}
	root, err := c.Tree()
	if err != nil {
		return nil, err
	}
	when := c.Committer.When
	b := &fsBuilder{a: a, files: memFS{}, when: &when}
	b.files.add(".", nil, fs.ModeDir|0o555, b.when)
	tree, prefix := root, ""
	if a.path != "." {
		entry, err := root.FindEntry(a.path)
		if errors.Is(err, object.ErrEntryNotFound) || errors.Is(err, object.ErrDirectoryNotFound) ||
			(err == nil && entry.Mode != filemode.Dir) {
			return b.files, nil // not a folder of this commit
		}
		if err != nil {
			return nil, err
		}
		if tree, err = object.GetTree(a.store, entry.Hash); err != nil {
			return nil, err
		}
		parts := strings.Split(a.path, "/")
		for i := range parts {
			name := strings.Join(parts[:i+1], "/")
			if err := b.charge(name, 0); err != nil {
				return nil, err
			}
			b.files.add(name, nil, fs.ModeDir|0o555, b.when)
		}
		prefix = a.path + "/"
	}
	// Reading every blob once, in tree order, is far cheaper than a checkout or than decoding
	// trees per Open. Every entry is counted and charged before anything is allocated for it.
	walker := object.NewTreeWalker(tree, true, nil)
	defer walker.Close()
	for {
		rel, entry, err := walker.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		name := prefix + rel
		switch entry.Mode {
		case filemode.Dir:
			if err := b.charge(name, 0); err != nil {
				return nil, err
			}
			b.files.add(name, nil, fs.ModeDir|0o555, b.when)
		case filemode.Regular, filemode.Executable, filemode.Deprecated:
			data, err := b.blob(name, entry.Hash)
			if err != nil {
				return nil, err
			}
			b.files.add(name, data, 0o444, b.when)
		default: // symlink or submodule: recorded, never resolved
			if err := b.charge(name, 0); err != nil {
				return nil, err
			}
			b.files.add(name, nil, fs.ModeSymlink|0o444, b.when)
		}
	}
	b.files.sort()
	return b.files, nil
}

// fsEntryBytes is what each entry of the FS (file, folder, link) counts against
// MaxTotalBytes besides its path and content: about what its node takes in memory, and more
// than the entry takes in its tree object, so the trees read count against the total too.
const fsEntryBytes = 256

// fsBuilder counts the entries of the FS being built and the bytes they hold.
type fsBuilder struct {
	a       *Artifact
	files   memFS
	when    *time.Time
	entries int
	total   int64
	blobs   map[plumbing.Hash][]byte // read so far
}

// blob checks and charges the file name, then reads its blob. Files with the same content
// share one slice (the FS never writes to it); each is charged in full all the same.
func (b *fsBuilder) blob(name string, h plumbing.Hash) ([]byte, error) {
	a := b.a
	if data, ok := b.blobs[h]; ok {
		return data, b.charge(name, int64(len(data)))
	}
	obj, err := a.store.EncodedObject(plumbing.BlobObject, h)
	if errors.Is(err, plumbing.ErrObjectNotFound) {
		return nil, a.fileTooLarge("%s is larger than the %s limit (--source-max-file-bytes): the server's filter left it out", name, size(a.maxFile))
	}
	if err != nil {
		return nil, err
	}
	n := obj.Size()
	if n > a.maxFile {
		return nil, a.fileTooLarge("%s is larger than the %s limit (--source-max-file-bytes): it has %s", name, size(a.maxFile), size(n))
	}
	if err := b.charge(name, n); err != nil {
		return nil, err
	}
	var data []byte // nil for an empty file
	if n > 0 {
		r, err := obj.Reader()
		if err != nil {
			return nil, err
		}
		data = make([]byte, n)
		_, err = io.ReadFull(r, data)
		if err == nil {
			if m, _ := r.Read(make([]byte, 1)); m > 0 {
				err = errors.New("more bytes than its header says")
			}
		}
		r.Close()
		if err != nil {
			return nil, fmt.Errorf("blob %s of %s (%d bytes): %w", h, name, n, err)
		}
	}
	if b.blobs == nil {
		b.blobs = map[plumbing.Hash][]byte{}
	}
	b.blobs[h] = data
	return data, nil
}

// charge counts one entry, name with content bytes, against MaxFiles and MaxTotalBytes.
func (b *fsBuilder) charge(name string, content int64) error {
	a := b.a
	if b.entries++; b.entries > a.maxFiles {
		return &Error{Op: "read", Subject: a.Revision, Kind: ErrTooLarge,
			Err: fmt.Errorf("there are more than %d files and folders under %s, the limit (--source-max-files), at %s",
				a.maxFiles, a.path, name),
			Hint: "split the folder, remove stray files, or raise the limit"}
	}
	if b.total += content + fsEntryBytes + int64(len(name)); b.total > a.maxTotal {
		return &Error{Op: "read", Subject: a.Revision, Kind: ErrTooLarge,
			Err: fmt.Errorf("the files under %s total more than the %s limit (--source-max-total-bytes), at %s (each file and folder counts %d bytes and its path besides its content)",
				a.path, size(a.maxTotal), name, fsEntryBytes),
			Hint: "split the folder, or raise the limit"}
	}
	return nil
}

func (a *Artifact) fileTooLarge(format string, args ...any) error {
	return &Error{Op: "read", Subject: a.Revision, Kind: ErrTooLarge, Err: fmt.Errorf(format, args...),
		Hint: "keep large files out of the folder, or raise the limit"}
}

// memFS is a read-only in-memory file tree: each folder keeps its entries, so listing a folder
// costs its own size (fstest.MapFS scans every file per listing, quadratic for 5,000 folders).
// A node is its own fs.FileInfo and fs.DirEntry, so an entry costs one node, its path (the
// map key, which the node's name shares) and a slot in its folder.
type memFS map[string]*memNode

type memNode struct {
	name     string
	mode     fs.FileMode
	when     *time.Time // the commit's time, shared by every node
	data     []byte
	children []*memNode // folders only, sorted by name
}

func (n *memNode) Name() string               { return n.name }
func (n *memNode) Size() int64                { return int64(len(n.data)) }
func (n *memNode) Mode() fs.FileMode          { return n.mode }
func (n *memNode) ModTime() time.Time         { return *n.when }
func (n *memNode) IsDir() bool                { return n.mode.IsDir() }
func (n *memNode) Sys() any                   { return nil }
func (n *memNode) Type() fs.FileMode          { return n.mode.Type() }
func (n *memNode) Info() (fs.FileInfo, error) { return n, nil }
func (n *memNode) String() string             { return fs.FormatFileInfo(n) }

// dirEntries returns a folder's entries as a new slice.
func dirEntries(children []*memNode) []fs.DirEntry {
	out := make([]fs.DirEntry, len(children))
	for i, c := range children {
		out[i] = c
	}
	return out
}

// add records a file or folder, "." first; the tree walker yields parents before children.
func (m memFS) add(name string, data []byte, mode fs.FileMode, when *time.Time) {
	if name == "." {
		m["."] = &memNode{name: ".", mode: fs.ModeDir | 0o555, when: when}
		return
	}
	n := &memNode{name: path.Base(name), mode: mode, when: when, data: data}
	m[name] = n
	if parent := m[path.Dir(name)]; parent != nil {
		parent.children = append(parent.children, n)
	}
}

func (m memFS) sort() {
	for _, n := range m {
		sort.Slice(n.children, func(i, j int) bool { return n.children[i].name < n.children[j].name })
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
	if n.IsDir() {
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
	if !n.IsDir() {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: errors.New("not a directory")}
	}
	return dirEntries(n.children), nil
}

// Stat implements fs.StatFS.
func (m memFS) Stat(name string) (fs.FileInfo, error) {
	n, err := m.node("stat", name)
	if err != nil {
		return nil, err
	}
	return n, nil
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

func (f *memFile) Stat() (fs.FileInfo, error) { return f.node, nil }
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
	return dirEntries(rest), nil
}
