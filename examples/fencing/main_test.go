package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/zlink-systems/authority/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFencing runs the program twice on one throwaway PostgreSQL database,
// each run on a new throwaway etcd cluster: the new generation's token is
// higher, its write lands, the old one's late write is refused and the
// balance stays the new owner's. The second run adopts its new cluster.
func TestFencing(t *testing.T) {
	if _, err := pgtest.BinDir(); errors.Is(err, pgtest.ErrNotInstalled) && !pgtest.Required() {
		t.Skipf("%v (CI=true or %s=1 make this a failure)", err, pgtest.EnvRequire)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	for i := range 2 {
		var out bytes.Buffer
		if err := run(ctx, &out, srv.DSN("postgres"), nil); err != nil {
			t.Fatalf("run %d: %v\n%s", i+1, err, out.String())
		}
		t.Logf("run %d:\n%s", i+1, out.String())
		text := out.String()
		adopted := regexp.MustCompile(`^the fence table followed etcd cluster ([0-9a-f]+) \(an earlier run's, gone\); adopted this run's cluster ([0-9a-f]+), dropping 1 tokens\n`)
		if m := adopted.FindStringSubmatch(text); (m != nil) != (i == 1) {
			t.Fatalf("run %d: adopted a new cluster: %v, want %v:\n%s", i+1, m != nil, i == 1, text)
		} else if m != nil {
			if m[1] == m[2] {
				t.Fatalf("the second run's cluster is the first's: %s", m[1])
			}
			text = strings.TrimPrefix(text, m[0])
		}
		checkRun(t, text)
	}
}

// checkRun checks the output of one run.
func checkRun(t *testing.T, text string) {
	t.Helper()
	m := regexp.MustCompile(`(?m)^owner-a@1 \(token (\d+)\) saved balance 100\nowner-a@2 \(token (\d+)\) took account-7 over and saved balance 250\n` +
		`refused the late write of owner-a@1: .*stale ownership token.*\nbalance of account-7: 250\n$`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("unexpected output:\n%s", text)
	}
	old, _ := strconv.ParseInt(m[1], 10, 64)
	next, _ := strconv.ParseInt(m[2], 10, 64)
	if next <= old {
		t.Errorf("the new generation's token %s is not above the old %s", m[2], m[1])
	}
}

// TestReadmeSnippetIsSaveBalance keeps README's "Fencing your own database"
// snippet equal to saveBalance (between its README:begin and README:end
// lines), so the code readers copy compiles and is what the test runs.
func TestReadmeSnippetIsSaveBalance(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(src), "// README:begin\n")
	want, _, ok2 := strings.Cut(after, "\n// README:end\n")
	if !ok || !ok2 {
		t.Fatal("main.go has no README:begin/README:end lines")
	}
	_, section, ok := strings.Cut(string(readme), "## Fencing your own database")
	if !ok {
		t.Fatal(`README has no "## Fencing your own database" section`)
	}
	if !strings.Contains(section, "```go\n"+want+"```\n") {
		t.Errorf("README's Fencing snippet differs from saveBalance in examples/fencing/main.go; copy it over:\n%s", want)
	}
}
