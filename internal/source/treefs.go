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
// Each blob's size is read from its object header and checked against MaxFileBytes, and the
// running total against MaxTotalBytes, before the blob is read. Errors are *Error:
// ErrTooLarge naming the file and the limit (also for a blob under Path that is absent
// because the server's filter left it out for its size), or ErrFetchFailed.
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
	files := memFS{}
	files.add(".", nil, fs.ModeDir|0o555, when)
	tree, prefix := root, ""
	if a.path != "." {
		entry, err := root.FindEntry(a.path)
		if errors.Is(err, object.ErrEntryNotFound) || errors.Is(err, object.ErrDirectoryNotFound) ||
			(err == nil && entry.Mode != filemode.Dir) {
			return files, nil // not a folder of this commit
		}
		if err != nil {
			return nil, err
		}
		if tree, err = object.GetTree(a.store, entry.Hash); err != nil {
			return nil, err
		}
		parts := strings.Split(a.path, "/")
		for i := range parts {
			files.add(strings.Join(parts[:i+1], "/"), nil, fs.ModeDir|0o555, when)
		}
		prefix = a.path + "/"
	}
	// Reading every blob once, in tree order, is far cheaper than a checkout or than decoding
	// trees per Open.
	var total int64
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
			files.add(name, nil, fs.ModeDir|0o555, when)
		case filemode.Regular, filemode.Executable, filemode.Deprecated:
			obj, err := a.store.EncodedObject(plumbing.BlobObject, entry.Hash)
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
			if total += n; total > a.maxTotal {
				return nil, &Error{Op: "read", Subject: a.Revision, Kind: ErrTooLarge,
					Err:  fmt.Errorf("the files under %s total more than the %s limit (--source-max-total-bytes), at %s", a.path, size(a.maxTotal), name),
					Hint: "split the folder, or raise the limit"}
			}
			r, err := obj.Reader()
			if err != nil {
				return nil, err
			}
			data, err := io.ReadAll(io.LimitReader(r, n+1))
			r.Close()
			if err != nil {
				return nil, err
			}
			if int64(len(data)) != n {
				return nil, fmt.Errorf("blob %s of %s holds %d bytes, not %d", entry.Hash, name, len(data), n)
			}
			files.add(name, data, 0o444, when)
		default: // symlink or submodule: recorded, never resolved
			files.add(name, nil, fs.ModeSymlink|0o444, when)
		}
	}
	files.sort()
	return files, nil
}

func (a *Artifact) fileTooLarge(format string, args ...any) error {
	return &Error{Op: "read", Subject: a.Revision, Kind: ErrTooLarge, Err: fmt.Errorf(format, args...),
		Hint: "keep large files out of the folder, or raise the limit"}
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

// add records a file or folder, "." first; the tree walker yields parents before children.
func (m memFS) add(name string, data []byte, mode fs.FileMode, when time.Time) {
	if name == "." {
		m["."] = &memNode{info: memInfo{name: ".", mode: fs.ModeDir | 0o555, when: when}}
		return
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
