package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// runMainEnv makes the test binary run main (as `go run` does), for
// TestTakeOverOutput.
const runMainEnv = "TAKEOVER_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	// run starts node-b as this executable: the test binary then is node-b
	if os.Getenv(nodeProcessEnv) != "" || os.Getenv(runMainEnv) != "" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

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
		`(?m)^node-a: node-b's owner lease expired at etcd [0-9.]+s after the kill`,
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

// TestTakeOverOutput runs the program as `go run` does and reads all it
// prints, stdout and stderr: every line is one of its steps (no client log
// lines), and the lease expiry it reports is measured from the kill: at
// least what the lease had left then. node-b renews its lease every third
// of the TTL, so at the kill it has at least two thirds of it left, and
// etcd expires it no sooner; a third is the bound (a renewal may be late on
// a loaded machine).
func TestTakeOverOutput(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the program failed: %v\n%s", err, out)
	}
	expiry := regexp.MustCompile(`^node-a: node-b's owner lease expired at etcd ([0-9.]+)s after the kill \(its TTL: ` +
		regexp.QuoteMeta(leaseTTL.String()) + `\)$`)
	steps := []*regexp.Regexp{
		regexp.MustCompile(`^Three nodes place carts on one etcd; node-b's process is killed, and node-a takes its$`),
		regexp.MustCompile(`^carts over once etcd expires node-b's owner lease \(TTL ` + regexp.QuoteMeta(leaseTTL.String()) + `\)\.$`),
		regexp.MustCompile(`^embedded etcd on 127\.0\.0\.1:\d+$`),
		regexp.MustCompile(`^node-[abc]: owner lease owner-node-[abc] generation 1, placed 2 carts( \(process \d+\))?$`),
		regexp.MustCompile(`^  user_spot/cart-[abc]-[12] +owner owner-node-[abc]@1 on node-[abc]$`),
		regexp.MustCompile(`^node-b's process killed: its lease is no longer renewed, nor revoked$`),
		expiry,
		regexp.MustCompile(`^took over 2 objects of node-b: \[user_spot/cart-b-1 user_spot/cart-b-2\]$`),
	}
	var expired []float64
	for line := range strings.Lines(string(out)) {
		line = strings.TrimSuffix(line, "\n")
		matched := false
		for _, step := range steps {
			if m := step.FindStringSubmatch(line); m != nil {
				matched = true
				if step == expiry {
					v, _ := strconv.ParseFloat(m[1], 64)
					expired = append(expired, v)
				}
			}
		}
		if !matched {
			t.Errorf("the program printed a line that is none of its steps: %q", line)
		}
	}
	if len(expired) != 1 {
		t.Fatalf("want one lease expiry line, got %d:\n%s", len(expired), out)
	}
	if bound := (leaseTTL / 3).Seconds(); expired[0] < bound {
		t.Errorf("lease expired %.1fs after the kill, want at least %.1fs (a third of its TTL %s):\n%s",
			expired[0], bound, leaseTTL, out)
	}
	fmt.Printf("lease expired %.1fs after the kill (TTL %s)\n", expired[0], leaseTTL)
}
