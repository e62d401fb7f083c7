package authority_test

import (
	"errors"
	"strings"
	"testing"

	authority "github.com/zlink-systems/authority"
)

// trickyIDs are global IDs that exercise every escaping rule of the key codec.
var trickyIDs = []string{
	"a",
	"plain-id_1.2~x",
	"a/b",
	"/",
	"//",
	"%",
	"%%",
	"%2F",
	"%41",
	"100%",
	"a%2Fb/c",
	"\x01",
	"\x1f",
	"\x7f",
	"tab\there",
	"line\nbreak\r",
	"\x1b[31m",
	"héllo wörld",
	"日本語/キー",
	"emoji 🎉",
	"\u2028",
	" ",
	"user_spot/x",
	"actor/",
	strings.Repeat("x/", 100),
}

func mustEncode(t testing.TB, kind authority.ObjectKind, id string) authority.Key {
	t.Helper()
	k, err := authority.EncodeKey(kind, id)
	if err != nil {
		t.Fatalf("EncodeKey(%q, %q): %v", kind, id, err)
	}
	return k
}

func TestKeyRoundTrip(t *testing.T) {
	kinds := []authority.ObjectKind{authority.ObjectActor, authority.ObjectUserSpot, authority.ObjectInstanceSpot, "user", "k0_9"}
	for _, kind := range kinds {
		for _, id := range trickyIDs {
			k := mustEncode(t, kind, id)
			if strings.Count(string(k), "/") != 1 {
				t.Errorf("EncodeKey(%q, %q) = %q: want exactly one '/'", kind, id, k)
			}
			if strings.IndexByte(string(k), '%') >= 0 && !strings.Contains(id, "%") && !strings.ContainsFunc(id, func(r rune) bool { return r < 0x20 || r == 0x7f || r == '/' }) {
				t.Errorf("EncodeKey(%q, %q) = %q: escaped a byte that needs no escape", kind, id, k)
			}
			for i := 0; i < len(k); i++ {
				if c := k[i]; c < 0x20 || c == 0x7f {
					t.Errorf("EncodeKey(%q, %q) = %q: contains control byte %#x", kind, id, k, c)
				}
			}
			if !strings.HasPrefix(string(k), authority.KindPrefix(kind)) {
				t.Errorf("EncodeKey(%q, %q) = %q: not under KindPrefix %q", kind, id, k, authority.KindPrefix(kind))
			}
			got, err := authority.DecodeKey(k)
			if err != nil {
				t.Fatalf("DecodeKey(%q): %v", k, err)
			}
			if got.Kind != kind || got.GlobalID != id {
				t.Errorf("DecodeKey(EncodeKey(%q, %q)) = %+v", kind, id, got)
			}
			viaObject, err := (authority.ObjectKey{Kind: kind, GlobalID: id}).Encode()
			if err != nil || viaObject != k {
				t.Errorf("ObjectKey.Encode = %q, %v; want %q", viaObject, err, k)
			}
			if k.String() != string(k) {
				t.Errorf("Key.String() = %q, want %q", k.String(), string(k))
			}
		}
	}
}

func TestEncodeKeyExactForms(t *testing.T) {
	cases := []struct {
		kind authority.ObjectKind
		id   string
		want authority.Key
	}{
		{authority.ObjectActor, "a", "actor/a"},
		{authority.ObjectActor, "a/b", "actor/a%2Fb"},
		{authority.ObjectActor, "%", "actor/%25"},
		{authority.ObjectActor, "\x01\x1f\x7f", "actor/%01%1F%7F"},
		{authority.ObjectUserSpot, "é", "user_spot/é"},
		{authority.ObjectInstanceSpot, "x y", "instance_spot/x y"},
	}
	for _, c := range cases {
		if got := mustEncode(t, c.kind, c.id); got != c.want {
			t.Errorf("EncodeKey(%q, %q) = %q, want %q", c.kind, c.id, got, c.want)
		}
	}
}

func TestKeyInjective(t *testing.T) {
	seen := map[authority.Key]authority.ObjectKey{}
	kinds := []authority.ObjectKind{authority.ObjectActor, authority.ObjectUserSpot, "user", "user_"}
	ids := append([]string{}, trickyIDs...)
	// Every single ASCII byte except NUL, and every two-byte combination of the
	// interesting ones.
	for b := 1; b < 128; b++ {
		ids = append(ids, string([]byte{byte(b)}))
	}
	special := []string{"%", "/", "2", "F", "5", "\x01", "a", "_"}
	for _, x := range special {
		for _, y := range special {
			ids = append(ids, x+y, x+"2F"+y, x+"25"+y)
		}
	}
	for _, kind := range kinds {
		for _, id := range ids {
			ok := authority.ObjectKey{Kind: kind, GlobalID: id}
			k := mustEncode(t, kind, id)
			if prev, dup := seen[k]; dup && prev != ok {
				t.Fatalf("EncodeKey(%+v) = EncodeKey(%+v) = %q", ok, prev, k)
			}
			seen[k] = ok
		}
	}
}

func TestKindPrefixSafety(t *testing.T) {
	kinds := []authority.ObjectKind{
		authority.ObjectActor, authority.ObjectUserSpot, authority.ObjectInstanceSpot,
		"user", "user_", "spot", "instance", "a", "ab",
	}
	for _, kind := range kinds {
		if got := authority.KindPrefix(kind); got != string(kind)+"/" {
			t.Errorf("KindPrefix(%q) = %q", kind, got)
		}
	}
	for _, listed := range kinds {
		prefix := authority.KindPrefix(listed)
		for _, other := range kinds {
			for _, id := range trickyIDs {
				k := mustEncode(t, other, id)
				if under := strings.HasPrefix(string(k), prefix); under != (listed == other) {
					t.Errorf("key %q (kind %q) under KindPrefix(%q) = %v", k, other, listed, under)
				}
			}
		}
	}
	// An ID that starts with another kind's name never lands under it.
	k := mustEncode(t, "user", "spot/x")
	if strings.HasPrefix(string(k), authority.KindPrefix(authority.ObjectUserSpot)) {
		t.Errorf("%q is under %q", k, authority.KindPrefix(authority.ObjectUserSpot))
	}
	k = mustEncode(t, "user", "_spot")
	if strings.HasPrefix(string(k), authority.KindPrefix(authority.ObjectUserSpot)) {
		t.Errorf("%q is under %q", k, authority.KindPrefix(authority.ObjectUserSpot))
	}
}

func TestEncodeKeyRejects(t *testing.T) {
	cases := []struct {
		name string
		kind authority.ObjectKind
		id   string
		msg  string
	}{
		{"empty kind", "", "x", "Authority object kind must be 1..64 characters of [a-z0-9_]."},
		{"upper-case kind", "Actor", "x", "Authority object kind must be 1..64 characters of [a-z0-9_]."},
		{"kind with slash", "a/b", "x", "Authority object kind must be 1..64 characters of [a-z0-9_]."},
		{"kind with dash", "user-spot", "x", "Authority object kind must be 1..64 characters of [a-z0-9_]."},
		{"kind 65 chars", authority.ObjectKind(strings.Repeat("a", 65)), "x", "Authority object kind must be 1..64 characters of [a-z0-9_]."},
		{"empty ID", authority.ObjectActor, "", "object global ID must be non-empty text without NUL."},
		{"NUL in ID", authority.ObjectActor, "a\x00b", "object global ID must be non-empty text without NUL."},
		{"only NUL", authority.ObjectActor, "\x00", "object global ID must be non-empty text without NUL."},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k, err := authority.EncodeKey(c.kind, c.id)
			checkInvalid(t, err, c.msg)
			if k != "" {
				t.Errorf("EncodeKey returned key %q with an error", k)
			}
		})
	}
	if _, err := authority.EncodeKey(authority.ObjectKind(strings.Repeat("a", 64)), "x"); err != nil {
		t.Errorf("64-character kind rejected: %v", err)
	}
}

func TestDecodeKeyRejects(t *testing.T) {
	const (
		sepMsg       = "Authority key must be <kind>/<global ID>."
		kindMsg      = "Authority object kind must be 1..64 characters of [a-z0-9_]."
		emptyMsg     = "object global ID must be non-empty text without NUL."
		truncMsg     = "Authority key contains a truncated escape."
		nonCanonMsg  = "Authority key contains a non-canonical escape."
		unescapedMsg = "Authority key contains an unescaped reserved byte."
	)
	cases := []struct {
		key authority.Key
		msg string
	}{
		{"", sepMsg},
		{"actor", sepMsg},
		{"actor%2Fx", sepMsg},
		{"/x", kindMsg},
		{"Actor/x", kindMsg},
		{"act or/x", kindMsg},
		{"act\x00or/x", kindMsg},
		{authority.Key(strings.Repeat("a", 65) + "/x"), kindMsg},
		{"actor/", emptyMsg},
		{"actor/%", truncMsg},
		{"actor/%2", truncMsg},
		{"actor/x%", truncMsg},
		{"actor/x%F", truncMsg},
		{"actor/%2f", nonCanonMsg},    // lower-case hex
		{"actor/%7f", nonCanonMsg},    // lower-case hex
		{"actor/%41", nonCanonMsg},    // 'A' needs no escape
		{"actor/%20", nonCanonMsg},    // ' ' needs no escape
		{"actor/%C3%A9", nonCanonMsg}, // UTF-8 bytes are not escaped
		{"actor/%FF", nonCanonMsg},
		{"actor/%00", nonCanonMsg}, // NUL is never in an ID
		{"actor/\xff", "object global ID must be valid UTF-8."},
		{"actor/%G0", nonCanonMsg},
		{"actor/%0G", nonCanonMsg},
		{"actor/%-1", nonCanonMsg},
		{"actor/%%25", nonCanonMsg},
		{"actor/a/b", unescapedMsg},
		{"actor//", unescapedMsg},
		{"actor/a\x00", unescapedMsg},
		{"actor/\x01", unescapedMsg},
		{"actor/a\nb", unescapedMsg},
		{"actor/\x7f", unescapedMsg},
		{"actor/%25/", unescapedMsg},
	}
	for _, c := range cases {
		got, err := authority.DecodeKey(c.key)
		if err == nil {
			t.Errorf("DecodeKey(%q) = %+v, want error %q", c.key, got, c.msg)
			continue
		}
		if !errors.Is(err, authority.ErrInvalidArgument) || err.Error() != c.msg {
			t.Errorf("DecodeKey(%q) error = %v, want ErrInvalidArgument %q", c.key, err, c.msg)
		}
		if got != (authority.ObjectKey{}) {
			t.Errorf("DecodeKey(%q) returned %+v with an error", c.key, got)
		}
	}
}

func TestObjectKindIsSpot(t *testing.T) {
	for kind, want := range map[authority.ObjectKind]bool{
		authority.ObjectActor: false, authority.ObjectUserSpot: true, authority.ObjectInstanceSpot: true,
		authority.CounterSpots: false, "": false, "user": false,
	} {
		if got := kind.IsSpot(); got != want {
			t.Errorf("%q.IsSpot() = %v, want %v", kind, got, want)
		}
	}
}

// checkInvalid asserts err wraps ErrInvalidArgument with exactly msg, and no
// other sentinel.
func checkInvalid(t testing.TB, err error, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want ErrInvalidArgument %q", msg)
	}
	if !errors.Is(err, authority.ErrInvalidArgument) {
		t.Fatalf("error %v does not wrap ErrInvalidArgument", err)
	}
	if errors.Is(err, authority.ErrUnavailable) || errors.Is(err, authority.ErrCorrupt) {
		t.Fatalf("error %v wraps an unrelated sentinel", err)
	}
	if err.Error() == msg {
		return
	}
	// a message several rules share carries the rule broken as its cause
	var e *authority.Error
	if !errors.As(err, &e) || e.Message != msg || e.Cause == nil {
		t.Fatalf("error message %q, want %q", err.Error(), msg)
	}
}
