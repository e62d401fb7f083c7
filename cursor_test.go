package authority_test

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	authority "github.com/zlink-systems/authority"
)

const msgCursor = "Authority scan cursor is invalid."
const msgCursorListing = "Authority scan cursor was made for another listing."

func TestScanCursorRoundTrip(t *testing.T) {
	positions := []authority.ScanPosition{
		{Scope: "ns", Prefix: "actor/", Revision: 1, After: "actor/a"},
		{Scope: "", Prefix: "", Revision: 0, After: "x"},
		{Scope: "/zlink/authority/", Prefix: "user_spot/", Revision: authority.MaxGeneration, After: "user_spot/a%2Fb"},
		{Scope: "ns", Prefix: "actor/", Revision: 7, After: "actor/日本語 🎉"},
		// Keys may hold any byte but NUL, including invalid UTF-8 and bytes
		// JSON escapes; the cursor must carry them exactly.
		{Scope: "ns", Prefix: "actor/\xff", Revision: 2, After: "actor/\xff\xfe"},
		{Scope: "s\xc3", Prefix: "actor/", Revision: 3, After: "actor/\xc3"},
		{Scope: "<&>", Prefix: "actor/\"\\", Revision: 4, After: "actor/\"\\\u2028<>&"},
	}
	for _, p := range positions {
		c := authority.EncodeScanCursor(p)
		if c == "" {
			t.Fatalf("EncodeScanCursor(%+v) is empty", p)
		}
		if strings.ContainsAny(string(c), "+/=") {
			t.Errorf("cursor %q is not unpadded base64url", c)
		}
		got, err := authority.ParseScanCursor(c)
		if err != nil || got != p {
			t.Errorf("ParseScanCursor(EncodeScanCursor(%+v)) = %+v, %v", p, got, err)
		}
		got, err = authority.DecodeScanCursor(c, p.Scope, p.Prefix)
		if err != nil || got != p {
			t.Errorf("DecodeScanCursor(EncodeScanCursor(%+v)) = %+v, %v", p, got, err)
		}
		if again := authority.EncodeScanCursor(got); again != c {
			t.Errorf("re-encoding %+v = %q, want %q", got, again, c)
		}
	}
}

func TestScanCursorDistinct(t *testing.T) {
	base := authority.ScanPosition{Scope: "ns", Prefix: "actor/", Revision: 5, After: "actor/a"}
	variants := []authority.ScanPosition{
		base,
		{Scope: "ns2", Prefix: base.Prefix, Revision: base.Revision, After: base.After},
		{Scope: base.Scope, Prefix: "actor/a", Revision: base.Revision, After: base.After},
		{Scope: base.Scope, Prefix: base.Prefix, Revision: 6, After: base.After},
		{Scope: base.Scope, Prefix: base.Prefix, Revision: base.Revision, After: "actor/b"},
	}
	seen := map[authority.ScanCursor]bool{}
	for _, v := range variants {
		c := authority.EncodeScanCursor(v)
		if seen[c] {
			t.Errorf("two positions encode to %q", c)
		}
		seen[c] = true
	}
}

func TestDecodeScanCursorListingMismatch(t *testing.T) {
	p := authority.ScanPosition{Scope: "ns", Prefix: "actor/", Revision: 5, After: "actor/a"}
	c := authority.EncodeScanCursor(p)
	for _, tc := range []struct{ scope, prefix string }{
		{"other", "actor/"},
		{"", "actor/"},
		{"ns", "user_spot/"},
		{"ns", "actor"},
		{"ns", ""},
		{"ns", "actor/a"},
	} {
		got, err := authority.DecodeScanCursor(c, tc.scope, tc.prefix)
		checkInvalid(t, err, msgCursorListing)
		if got != (authority.ScanPosition{}) {
			t.Errorf("DecodeScanCursor returned %+v with an error", got)
		}
	}
	// A malformed cursor is reported as such, whatever the listing.
	_, err := authority.DecodeScanCursor("!!", "ns", "actor/")
	checkInvalid(t, err, msgCursor)
}

// wire builds a cursor from raw JSON, the way a forger would.
func wire(js string) authority.ScanCursor {
	return authority.ScanCursor(base64.RawURLEncoding.EncodeToString([]byte(js)))
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func TestParseScanCursorRejects(t *testing.T) {
	good := authority.ScanPosition{Scope: "ns", Prefix: "actor/", Revision: 5, After: "actor/a"}
	c := authority.EncodeScanCursor(good)
	raw, err := base64.RawURLEncoding.DecodeString(string(c))
	if err != nil {
		t.Fatal(err)
	}
	goodJSON := string(raw)
	if _, err := authority.ParseScanCursor(wire(goodJSON)); err != nil {
		t.Fatalf("the canonical wire form %s is rejected: %v", goodJSON, err)
	}
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		t.Fatal(err)
	}
	withField := func(name string, value any) authority.ScanCursor {
		m := map[string]any{}
		for k, v := range fields {
			m[k] = v
		}
		if value == nil {
			delete(m, name)
		} else {
			m[name] = value
		}
		out, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return wire(string(out))
	}

	cases := map[string]authority.ScanCursor{
		"empty":                  "",
		"not base64":             "!!!",
		"base64 with padding":    authority.ScanCursor(base64.URLEncoding.EncodeToString(raw)),
		"std base64 alphabet":    authority.ScanCursor(strings.NewReplacer("-", "+", "_", "/").Replace(string(c)) + "+"),
		"base64 with newline":    c[:4] + "\n" + c[4:],
		"non-canonical trailing": nonCanonicalTail(t, raw),
		"too long":               authority.ScanCursor(strings.Repeat("A", 4*authority.MaxPayloadBytes+1)),
		"not JSON":               wire("hello"),
		"JSON array":             wire("[1,2]"),
		"JSON string":            wire(`"x"`),
		"JSON null":              wire("null"),
		"empty object":           wire("{}"),
		"trailing object":        wire(goodJSON + "{}"),
		"trailing brace":         wire(goodJSON + "}"),
		"trailing bracket":       wire(goodJSON + "]"),
		"trailing garbage":       wire(goodJSON + "x"),
		"trailing space":         wire(goodJSON + " "),
		"leading space":          wire(" " + goodJSON),
		"two objects":            wire(goodJSON + goodJSON),
		"unknown field":          withField("x", 1),
		"upper-case field":       wire(strings.Replace(goodJSON, `"v"`, `"V"`, 1)),
		"missing version":        withField("v", nil),
		"version 0":              withField("v", 0),
		"version 2":              withField("v", 2),
		"missing after":          withField("a", nil),
		"empty after":            withField("a", ""),
		"null after":             wire(strings.Replace(goodJSON, `"a":"`+b64("actor/a")+`"`, `"a":null`, 1)),
		"after not under prefix": withField("a", b64("user_spot/a")),
		"after is bare prefix":   withField("a", b64("actor")),
		"negative revision":      withField("r", -1),
		"fractional revision":    withField("r", 1.5),
		"string revision":        withField("r", "5"),
		"revision overflow":      wire(strings.Replace(goodJSON, `"r":5`, `"r":9223372036854775808`, 1)),
		"revision leading zero":  wire(strings.Replace(goodJSON, `"r":5`, `"r":05`, 1)),
		"revision exponent":      wire(strings.Replace(goodJSON, `"r":5`, `"r":5e0`, 1)),
		"prefix as JSON string":  wire(strings.Replace(goodJSON, `"p":"`+b64("actor/")+`"`, `"p":"actor/"`, 1)),
		"prefix not base64":      withField("p", "***"),
		"prefix padding dropped": withField("p", strings.TrimRight(b64("actor/a"), "=")),
		"null scope":             wire(strings.Replace(goodJSON, `"s":"`+b64("ns")+`"`, `"s":null`, 1)),
		"fields reordered":       reordered(t, fields),
		"whitespace inside":      wire(strings.Replace(goodJSON, ",", ", ", 1)),
		"escaped field name":     wire(strings.Replace(goodJSON, `"v"`, `"\u0076"`, 1)),
		"duplicate field":        wire(strings.Replace(goodJSON, `{`, `{"r":6,`, 1)),
	}
	for name, cur := range cases {
		t.Run(name, func(t *testing.T) {
			if cur == c {
				t.Fatalf("case is the canonical cursor itself")
			}
			got, err := authority.ParseScanCursor(cur)
			checkInvalid(t, err, msgCursor)
			if got != (authority.ScanPosition{}) {
				t.Errorf("ParseScanCursor returned %+v with an error", got)
			}
		})
	}
}

// nonCanonicalTail re-encodes raw with the unused low bits of the last
// base64 character set, which lenient decoders accept.
func nonCanonicalTail(t *testing.T, raw []byte) authority.ScanCursor {
	t.Helper()
	for len(raw)%3 == 0 { // make sure there are spare bits
		raw = append(raw, ' ')
	}
	s := []byte(base64.RawURLEncoding.EncodeToString(raw))
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, s[len(s)-1])
	s[len(s)-1] = alphabet[i|1]
	return authority.ScanCursor(s)
}

func reordered(t *testing.T, fields map[string]any) authority.ScanCursor {
	t.Helper()
	// Go's map marshalling sorts keys: a, p, r, s, v — not the canonical order.
	out, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	return wire(string(out))
}
