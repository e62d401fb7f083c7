package authority

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
)

// ScanPosition is what a scan cursor carries. Providers encode it with
// EncodeScanCursor and check it with DecodeScanCursor; callers only see the
// opaque ScanCursor.
type ScanPosition struct {
	// Scope binds the cursor to one store (for etcd, its namespace).
	Scope string `json:"s"`
	// Prefix is the listing's prefix.
	Prefix string `json:"p"`
	// Revision is the provider's revision the listing reads at.
	Revision int64 `json:"r"`
	// After is the last key returned; the next page starts after it.
	After Key `json:"a"`
}

const cursorVersion = 1

// cursorWire is the JSON form of a cursor. The strings travel as bytes
// (base64 in JSON): keys and prefixes may hold invalid UTF-8, which JSON
// strings would silently replace with U+FFFD.
type cursorWire struct {
	V int    `json:"v"`
	S []byte `json:"s"`
	P []byte `json:"p"`
	R int64  `json:"r"`
	A []byte `json:"a"`
}

// EncodeScanCursor encodes a scan position as an opaque cursor.
func EncodeScanCursor(p ScanPosition) ScanCursor {
	raw, err := json.Marshal(cursorWire{
		V: cursorVersion, S: []byte(p.Scope), P: []byte(p.Prefix), R: p.Revision, A: []byte(p.After),
	})
	if err != nil {
		panic(err) // byte slices and integers always marshal
	}
	return ScanCursor(base64.RawURLEncoding.EncodeToString(raw))
}

// DecodeScanCursor decodes a cursor and checks it was made by EncodeScanCursor
// for this scope and prefix. A malformed cursor, or one made for another
// scope or prefix, is ErrInvalidArgument.
func DecodeScanCursor(c ScanCursor, scope, prefix string) (ScanPosition, error) {
	p, err := ParseScanCursor(c)
	if err != nil {
		return ScanPosition{}, err
	}
	if p.Scope != scope || p.Prefix != prefix {
		return ScanPosition{}, Invalid("Authority scan cursor was made for another listing.")
	}
	return p, nil
}

// ParseScanCursor decodes a cursor without checking its scope or prefix.
func ParseScanCursor(c ScanCursor) (ScanPosition, error) {
	invalid := Invalid("Authority scan cursor is invalid.")
	if len(c) == 0 || len(c) > 4*MaxPayloadBytes {
		return ScanPosition{}, invalid
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(string(c))
	if err != nil {
		return ScanPosition{}, invalid
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var w cursorWire
	if err := dec.Decode(&w); err != nil || dec.More() {
		return ScanPosition{}, invalid
	}
	if _, err := dec.Token(); err == nil {
		return ScanPosition{}, invalid
	}
	p := ScanPosition{Scope: string(w.S), Prefix: string(w.P), Revision: w.R, After: Key(w.A)}
	if w.V != cursorVersion || p.Revision < 0 || p.After == "" ||
		!strings.HasPrefix(string(p.After), p.Prefix) ||
		EncodeScanCursor(p) != c {
		return ScanPosition{}, invalid
	}
	return p, nil
}
