package authority_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	authority "github.com/zlink-systems/authority"
)

// validKindName is the fuzz oracle for kind names: 1..64 of [a-z0-9_].
func validKindName(k string) bool {
	if k == "" || len(k) > 64 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

func validGlobalID(id string) bool {
	return id != "" && !strings.Contains(id, "\x00") && utf8.ValidString(id)
}

// FuzzKeyRoundTrip checks EncodeKey→DecodeKey is the identity, that EncodeKey
// rejects exactly the invalid inputs, and that DecodeKey of arbitrary text
// either fails with ErrInvalidArgument or re-encodes to that same text.
func FuzzKeyRoundTrip(f *testing.F) {
	for _, id := range trickyIDs {
		f.Add("actor", id)
	}
	f.Add("user_spot", "%2F")
	f.Add("Actor", "x")
	f.Add("actor", "")
	f.Add("actor", "a\x00")
	f.Add("actor", "%2f")
	f.Add("actor", "%00")
	f.Fuzz(func(t *testing.T, kind, id string) {
		key, err := authority.EncodeKey(authority.ObjectKind(kind), id)
		if valid := validKindName(kind) && validGlobalID(id); valid != (err == nil) {
			t.Fatalf("EncodeKey(%q, %q) = %q, %v; valid input: %v", kind, id, key, err, valid)
		}
		if err != nil {
			if !errors.Is(err, authority.ErrInvalidArgument) {
				t.Fatalf("EncodeKey error %v is not ErrInvalidArgument", err)
			}
		} else {
			if !strings.HasPrefix(string(key), authority.KindPrefix(authority.ObjectKind(kind))) ||
				strings.Count(string(key), "/") != 1 {
				t.Fatalf("EncodeKey(%q, %q) = %q: not <kind>/<escaped ID>", kind, id, key)
			}
			got, err := authority.DecodeKey(key)
			if err != nil || got.Kind != authority.ObjectKind(kind) || got.GlobalID != id {
				t.Fatalf("DecodeKey(EncodeKey(%q, %q) = %q) = %+v, %v", kind, id, key, got, err)
			}
		}
		for _, text := range []string{id, kind + "/" + id, kind} {
			decoded, err := authority.DecodeKey(authority.Key(text))
			if err != nil {
				if !errors.Is(err, authority.ErrInvalidArgument) {
					t.Fatalf("DecodeKey(%q) error %v is not ErrInvalidArgument", text, err)
				}
				continue
			}
			again, err := decoded.Encode()
			if err != nil || string(again) != text {
				t.Fatalf("DecodeKey(%q) = %+v re-encodes to %q, %v", text, decoded, again, err)
			}
		}
	})
}

// FuzzKeyInjective checks two distinct objects never share a key, and a key
// is under KindPrefix of its own kind only.
func FuzzKeyInjective(f *testing.F) {
	f.Add("actor", "a/b", "actor", "a%2Fb")
	f.Add("actor", "%", "actor", "%25")
	f.Add("user", "spot/x", "user_spot", "x")
	f.Add("user", "_spot", "user_spot", "")
	f.Add("actor", "\x01", "actor", "%01")
	f.Add("actor", "\xff", "actor", "\xc3\xbf")
	f.Fuzz(func(t *testing.T, kind1, id1, kind2, id2 string) {
		k1, err1 := authority.EncodeKey(authority.ObjectKind(kind1), id1)
		k2, err2 := authority.EncodeKey(authority.ObjectKind(kind2), id2)
		if err1 != nil || err2 != nil {
			return
		}
		same := kind1 == kind2 && id1 == id2
		if (k1 == k2) != same {
			t.Fatalf("EncodeKey(%q, %q) = %q, EncodeKey(%q, %q) = %q", kind1, id1, k1, kind2, id2, k2)
		}
		under := strings.HasPrefix(string(k2), authority.KindPrefix(authority.ObjectKind(kind1)))
		if under != (kind1 == kind2) {
			t.Fatalf("key %q of kind %q under KindPrefix(%q) = %v", k2, kind2, kind1, under)
		}
	})
}

// FuzzScanCursor checks ParseScanCursor never panics on arbitrary text, that
// every cursor it accepts re-encodes to exactly that text, and that every
// position round-trips through EncodeScanCursor.
func FuzzScanCursor(f *testing.F) {
	good := authority.EncodeScanCursor(authority.ScanPosition{Scope: "ns", Prefix: "actor/", Revision: 5, After: "actor/a"})
	f.Add(string(good), "ns", "actor/", "a", int64(5))
	f.Add("", "", "", "x", int64(0))
	f.Add("eyJ2IjoxfQ", "s", "actor/\xff", "\xfe", int64(-1))
	f.Add(string(good)+"A", "\"", "<&>", "\u2028", int64(1)<<62)
	f.Fuzz(func(t *testing.T, cursor, scope, prefix, suffix string, revision int64) {
		p, err := authority.ParseScanCursor(authority.ScanCursor(cursor))
		if err != nil {
			if !errors.Is(err, authority.ErrInvalidArgument) {
				t.Fatalf("ParseScanCursor(%q) error %v is not ErrInvalidArgument", cursor, err)
			}
		} else {
			if again := authority.EncodeScanCursor(p); string(again) != cursor {
				t.Fatalf("ParseScanCursor(%q) = %+v re-encodes to %q", cursor, p, again)
			}
			if p.Revision < 0 || p.After == "" || !strings.HasPrefix(string(p.After), p.Prefix) {
				t.Fatalf("ParseScanCursor(%q) accepted %+v", cursor, p)
			}
			if q, err := authority.DecodeScanCursor(authority.ScanCursor(cursor), p.Scope, p.Prefix); err != nil || q != p {
				t.Fatalf("DecodeScanCursor(%q) = %+v, %v", cursor, q, err)
			}
		}

		if suffix == "" {
			suffix = "x"
		}
		if revision < 0 {
			revision = -(revision + 1)
		}
		pos := authority.ScanPosition{Scope: scope, Prefix: prefix, Revision: revision, After: authority.Key(prefix + suffix)}
		c := authority.EncodeScanCursor(pos)
		got, err := authority.DecodeScanCursor(c, scope, prefix)
		if err != nil || got != pos {
			t.Fatalf("DecodeScanCursor(EncodeScanCursor(%+v)) = %+v, %v", pos, got, err)
		}
	})
}
