package etcd_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadmeSnippetIsExampleNew keeps README's "Plugging the provider"
// snippet equal to the body of ExampleNew (between its README:begin and
// README:end lines), so the snippet readers copy is code that compiles.
func TestReadmeSnippetIsExampleNew(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	want := exampleBody(t, string(example))
	got := readmeSnippet(t, string(readme))
	if got != want {
		t.Errorf("README's snippet after \"ExampleNew\" differs from ExampleNew's body; copy it over.\nREADME:\n%s\nExampleNew:\n%s", got, want)
	}
}

// exampleBody returns the lines of src between "// README:begin" and
// "// README:end", one tab of indentation removed.
func exampleBody(t *testing.T, src string) string {
	t.Helper()
	_, after, ok := strings.Cut(src, "\t// README:begin\n")
	body, _, ok2 := strings.Cut(after, "\t// README:end\n")
	if !ok || !ok2 {
		t.Fatal("example_test.go has no README:begin/README:end lines")
	}
	lines := strings.Split(strings.TrimSuffix(body, "\n"), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "\t")
	}
	return strings.Join(lines, "\n") + "\n"
}

// readmeSnippet returns the first ```go block of readme after the line that
// names ExampleNew.
func readmeSnippet(t *testing.T, readme string) string {
	t.Helper()
	i := strings.Index(readme, "ExampleNew")
	if i < 0 {
		t.Fatal("README does not name ExampleNew")
	}
	_, block, ok := strings.Cut(readme[i:], "```go\n")
	block, _, ok2 := strings.Cut(block, "```\n")
	if !ok || !ok2 {
		t.Fatal("README has no ```go block after ExampleNew")
	}
	return block
}
