package main

import (
	"bytes"
	"context"
	"regexp"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestTakeOver runs the program: node-b's two carts end up owned by node-a,
// every other row stays where it was.
func TestTakeOver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	text := out.String()
	for _, want := range []string{
		`(?m)^took over 2 objects of node-b: \[user_spot/cart-b-1 user_spot/cart-b-2\]$`,
		`(?m)^node-a: node-b's owner lease expired at etcd after`,
	} {
		if !regexp.MustCompile(want).MatchString(text) {
			t.Errorf("output does not match %s:\n%s", want, text)
		}
	}
	// the placement printed last: b's carts on node-a, a's and c's unchanged
	_, final, _ := bytes.Cut(out.Bytes(), []byte("took over"))
	for _, want := range []string{
		`user_spot/cart-a-1 +owner owner-node-a@1 on node-a`,
		`user_spot/cart-b-1 +owner owner-node-a@1 on node-a`,
		`user_spot/cart-b-2 +owner owner-node-a@1 on node-a`,
		`user_spot/cart-c-2 +owner owner-node-c@1 on node-c`,
	} {
		if !regexp.MustCompile(want).Match(final) {
			t.Errorf("final placement does not match %s:\n%s", want, final)
		}
	}
}
