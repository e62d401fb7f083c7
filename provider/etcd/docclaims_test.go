package etcd_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeStatesNoSubtestCounts: README states no hand-copied count of
// subtests ("388 subtests"): such a count drifts with every test added, and
// `go test -v` lists them.
func TestReadmeStatesNoSubtestCounts(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile("\\d+ (`[^`]*` )?subtests").FindAllString(string(readme), -1) {
		t.Errorf("README states a subtest count, %q: say what runs instead (a count drifts)", m)
	}
}

// TestPerformanceDocBenchmarksExist: every benchmark docs/performance.md
// names (its figures' source) is a benchmark of the repository.
func TestPerformanceDocBenchmarksExist(t *testing.T) {
	root := filepath.Join("..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "performance.md"))
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	def := regexp.MustCompile(`(?m)^func (Benchmark\w+)\(`)
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		for _, m := range def.FindAllStringSubmatch(string(src), -1) {
			defined[m[1]] = true
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile(`Benchmark[A-Z]\w*`).FindAllString(string(doc), -1)
	if len(named) == 0 || !defined["BenchmarkEtcdBatching"] {
		t.Fatalf("docs/performance.md names %d benchmarks; BenchmarkEtcdBatching defined: %v", len(named), defined["BenchmarkEtcdBatching"])
	}
	for _, name := range named {
		if !defined[name] {
			t.Errorf("docs/performance.md names %s, which no _test.go file defines", name)
		}
	}
}
