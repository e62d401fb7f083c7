package etcd_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
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

// TestWhereThingsLiveNamesEveryFile: the "Where things live" map of
// docs/design-etcd.md names every non-test file and every package of
// provider/etcd (a name may be a glob: `feed*.go`), and every file or folder
// it names exists.
func TestWhereThingsLiveNamesEveryFile(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "design-etcd.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Where things live\n")
	if !ok {
		t.Fatal(`docs/design-etcd.md has no "## Where things live" section`)
	}
	section, _, _ = strings.Cut(section, "\n#")
	var names []string
	for _, m := range regexp.MustCompile("`([^`\\s]+(?:\\.go|/))`").FindAllStringSubmatch(section, -1) {
		names = append(names, m[1])
	}
	if len(names) < 10 {
		t.Fatalf("the map names only %v", names)
	}
	var have []string // files and folders (with a trailing /), relative to provider/etcd
	for _, dir := range []string{".", "internal"} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			name := filepath.ToSlash(filepath.Join(dir, e.Name()))
			switch {
			case e.IsDir() && name != "internal":
				have = append(have, name+"/")
			case !e.IsDir() && strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go"):
				have = append(have, name)
			}
		}
	}
	matches := func(pattern, name string) bool {
		ok, err := filepath.Match(pattern, name)
		return err == nil && ok
	}
	for _, h := range have {
		if !slices.ContainsFunc(names, func(n string) bool { return matches(n, h) }) {
			t.Errorf("docs/design-etcd.md, Where things live: provider/etcd/%s is not on the map", h)
		}
	}
	for _, n := range names {
		if !slices.ContainsFunc(have, func(h string) bool { return matches(n, h) }) {
			t.Errorf("docs/design-etcd.md, Where things live: %s names nothing in provider/etcd", n)
		}
	}
}
