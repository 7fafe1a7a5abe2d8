package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// DuplicateKeyError is a call's arguments naming one key twice in one JSON object. The SDK and
// the engine decode arguments into maps, which keep the last value, while an upstream may read
// the first: the engine would check one value and the upstream act on another, so such
// arguments are refused (issue 18).
type DuplicateKeyError struct {
	Key string
	// Path is the JSON Pointer of the object holding Key ("" for the arguments object itself).
	Path string
}

// Error is `arguments contain the key "x" twice`, followed by ` (in /path)` when the object is
// nested.
func (e *DuplicateKeyError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("arguments contain the key %q twice", e.Key)
	}
	return fmt.Sprintf("arguments contain the key %q twice (in %s)", e.Key, e.Path)
}

// maxDupDepth is where CheckDuplicateKeys stops descending: encoding/json refuses values nested
// deeper than 10,000 anyway, and the walk must not grow the stack without bound.
const maxDupDepth = 10000

// CheckDuplicateKeys reads raw (a call's arguments as sent) with a streaming decoder and
// returns a *DuplicateKeyError for the first object, at any depth, that names a key twice.
// Keys are compared as decoded, so "a" and "\u0061" are the same key. It returns nil for
// arguments without duplicates, for text that is not valid JSON and for values nested deeper
// than encoding/json accepts (the caller's decoder refuses those).
func CheckDuplicateKeys(raw []byte) error {
	if bytes.IndexByte(raw, '{') < 0 {
		return nil // no object, so no key
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // numbers are skipped: no float conversion
	w := dupWalker{dec: dec}
	err := w.value()
	if d, ok := err.(*DuplicateKeyError); ok {
		return d
	}
	return nil
}

type dupWalker struct {
	dec  *json.Decoder
	path []string // pointer segments of the value being read
}

var errDupStop = fmt.Errorf("stop")

func (w *dupWalker) value() error {
	if len(w.path) > maxDupDepth {
		return errDupStop
	}
	tok, err := w.dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		keys := map[string]struct{}{}
		for w.dec.More() {
			kt, err := w.dec.Token()
			if err != nil {
				return err
			}
			k, _ := kt.(string)
			if _, dup := keys[k]; dup {
				return &DuplicateKeyError{Key: k, Path: w.pointer()}
			}
			keys[k] = struct{}{}
			w.path = append(w.path, k)
			err = w.value()
			w.path = w.path[:len(w.path)-1]
			if err != nil {
				return err
			}
		}
		_, err = w.dec.Token() // '}'
		return err
	case json.Delim('['):
		for i := 0; w.dec.More(); i++ {
			w.path = append(w.path, strconv.Itoa(i))
			err := w.value()
			w.path = w.path[:len(w.path)-1]
			if err != nil {
				return err
			}
		}
		_, err = w.dec.Token() // ']'
		return err
	}
	return nil // a scalar
}

var pointerEscape = strings.NewReplacer("~", "~0", "/", "~1")

// pointer is the JSON Pointer (RFC 6901) of the value being read.
func (w *dupWalker) pointer() string {
	var b strings.Builder
	for _, s := range w.path {
		b.WriteByte('/')
		b.WriteString(pointerEscape.Replace(s))
	}
	return b.String()
}
