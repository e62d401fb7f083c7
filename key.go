package authority

import (
	"strings"
	"unicode/utf8"
)

// ObjectKind names the kind of object an authority row describes.
type ObjectKind string

// The object kinds of the framework.
const (
	ObjectActor        ObjectKind = "actor"
	ObjectUserSpot     ObjectKind = "user_spot"
	ObjectInstanceSpot ObjectKind = "instance_spot"
)

// IsSpot reports whether k is one of the Spot kinds.
func (k ObjectKind) IsSpot() bool { return k == ObjectUserSpot || k == ObjectInstanceSpot }

// Key is an encoded authority key, as produced by EncodeKey. Providers treat
// it as opaque non-empty text without NUL; rows are listed in byte order of
// their keys.
type Key string

// String returns the key text.
func (k Key) String() string { return string(k) }

// ObjectKey identifies an object by kind and global ID, before encoding.
type ObjectKey struct {
	// Kind is the object's kind: in a request, ObjectActor, ObjectUserSpot
	// or ObjectInstanceSpot.
	Kind ObjectKind
	// GlobalID is the object's ID, unique within its kind (the framework's
	// global ID): non-empty UTF-8 text without NUL; EncodeKey escapes '%',
	// '/' and control bytes.
	GlobalID string
}

// Encode returns EncodeKey(k.Kind, k.GlobalID).
func (k ObjectKey) Encode() (Key, error) { return EncodeKey(k.Kind, k.GlobalID) }

// KeySeparator separates the kind from the escaped global ID in a Key.
const KeySeparator = '/'

// EncodeKey encodes an object's kind and global ID into an authority key of
// the form "<kind>/<escaped global ID>".
//
// The kind must be lower-case ASCII letters, digits and '_'. The global ID
// must be non-empty text without NUL; the bytes '%', '/', ASCII control
// characters and DEL are written as "%XX" (upper-case hex). The encoding is
// injective, the result contains exactly one '/', and KindPrefix(kind) is a
// prefix of exactly the keys of that kind.
func EncodeKey(kind ObjectKind, globalID string) (Key, error) {
	if err := validateKindName(kind); err != nil {
		return "", err
	}
	if err := RequireText(globalID, "object global ID"); err != nil {
		return "", err
	}
	var b strings.Builder
	b.Grow(len(kind) + 1 + len(globalID))
	b.WriteString(string(kind))
	b.WriteByte(KeySeparator)
	for i := 0; i < len(globalID); i++ {
		c := globalID[i]
		if needsEscape(c) {
			const hexDigits = "0123456789ABCDEF"
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&0xf])
			continue
		}
		b.WriteByte(c)
	}
	return Key(b.String()), nil
}

// DecodeKey is the inverse of EncodeKey. It rejects, with ErrInvalidArgument,
// any text EncodeKey cannot produce (missing separator, bad kind, empty ID,
// malformed or non-canonical escapes).
func DecodeKey(key Key) (ObjectKey, error) {
	s := string(key)
	sep := strings.IndexByte(s, KeySeparator)
	if sep < 0 {
		return ObjectKey{}, Invalid("Authority key must be <kind>/<global ID>.")
	}
	kind := ObjectKind(s[:sep])
	if err := validateKindName(kind); err != nil {
		return ObjectKey{}, err
	}
	escaped := s[sep+1:]
	if escaped == "" {
		return ObjectKey{}, Invalid("object global ID must be non-empty text without NUL.")
	}
	var b strings.Builder
	b.Grow(len(escaped))
	for i := 0; i < len(escaped); i++ {
		c := escaped[i]
		if c == '%' {
			if i+2 >= len(escaped) {
				return ObjectKey{}, Invalid("Authority key contains a truncated escape.")
			}
			hi, ok1 := upperHex(escaped[i+1])
			lo, ok2 := upperHex(escaped[i+2])
			decoded := hi<<4 | lo
			if !ok1 || !ok2 || !needsEscape(decoded) || decoded == 0 {
				return ObjectKey{}, Invalid("Authority key contains a non-canonical escape.")
			}
			b.WriteByte(decoded)
			i += 2
			continue
		}
		if needsEscape(c) {
			return ObjectKey{}, Invalid("Authority key contains an unescaped reserved byte.")
		}
		b.WriteByte(c)
	}
	id := b.String()
	if !utf8.ValidString(id) {
		return ObjectKey{}, Invalid("object global ID must be valid UTF-8.")
	}
	return ObjectKey{Kind: kind, GlobalID: id}, nil
}

// KindPrefix returns the listing prefix of every key of kind ("<kind>/").
func KindPrefix(kind ObjectKind) string { return string(kind) + string(KeySeparator) }

func needsEscape(c byte) bool { return c == '%' || c == '/' || c < 0x20 || c == 0x7f }

func upperHex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func validateKindName(kind ObjectKind) error {
	if kind == "" || len(kind) > 64 {
		return Invalid("Authority object kind must be 1..64 characters of [a-z0-9_].")
	}
	for i := 0; i < len(kind); i++ {
		c := kind[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return Invalid("Authority object kind must be 1..64 characters of [a-z0-9_].")
		}
	}
	return nil
}
