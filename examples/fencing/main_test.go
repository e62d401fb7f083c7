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

	"github.com/zlink-systems/authority/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFencing runs the program against a throwaway PostgreSQL: the new
// generation's token is higher, its write lands, the old one's late write is
// refused and the balance stays the new owner's.
func TestFencing(t *testing.T) {
	if _, err := pgtest.BinDir(); errors.Is(err, pgtest.ErrNotInstalled) && !pgtest.Required() {
		t.Skipf("%v (CI=true or %s=1 make this a failure)", err, pgtest.EnvRequire)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, ""); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	text := out.String()
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
