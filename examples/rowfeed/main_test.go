package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRowFeed runs the program: the index lists two carts; restarted, it
// resumes after the revision it stopped at and gets exactly the changes
// made meanwhile; after the compaction it relists the three carts; the view
// reads cart-4 from memory, and its second consistent read sees the write
// made before it.
func TestRowFeed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	text := out.String()
	want := `(?s)` +
		`\nindex: listed 2 carts at revision (\d+): \[user_spot/cart-1 user_spot/cart-2\]\n` +
		`index stopped at revision (\d+);[^\n]*\n` +
		`index: resuming after revision (\d+)\n` +
		`index: created user_spot/cart-3 at revision \d+: "creating"\n` +
		`index: updated user_spot/cart-3 at revision \d+: "cart-3, empty"\n` +
		`index: removed user_spot/cart-1 at revision (\d+)\n` +
		`index stopped at revision (\d+); meanwhile cart-4 is placed and etcd compacts its history up to revision \d+\n` +
		`index: resuming after revision (\d+)\n` +
		`index: the history after revision (\d+) is compacted \(ErrFeedCompacted\): relisting\n` +
		`index: listed 3 carts at revision \d+: \[user_spot/cart-2 user_spot/cart-3 user_spot/cart-4\]\n` +
		`relisted after ErrFeedCompacted: 3 carts at revision \d+\n` +
		`view: user_spot/cart-4 is "cart-4, empty" at revision (\d+) \(from memory: true\)\n` +
		`cart-4 updated through the store\n` +
		`view: user_spot/cart-4 is "cart-4, 3 items" at revision (\d+) \(from memory: true\)\n` +
		`the index holds 3 carts;`
	m := regexp.MustCompile(want).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("output does not match\n%s\nit is:\n%s", want, text)
	}
	rev := func(i int) int64 { v, _ := strconv.ParseInt(m[i], 10, 64); return v }
	if rev(2) != rev(1) || rev(3) != rev(1) {
		t.Errorf("the index stopped at %d and resumed after %d; want its listing's revision %d", rev(2), rev(3), rev(1))
	}
	if rev(5) != rev(4) || rev(6) != rev(4) || rev(7) != rev(4) {
		t.Errorf("second stop %d, resume %d, compacted after %d; want the last change applied, %d", rev(5), rev(6), rev(7), rev(4))
	}
	if rev(9) <= rev(8) {
		t.Errorf("the view's read after the write reflects revision %d, not after %d", rev(9), rev(8))
	}
}
