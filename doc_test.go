package authority_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageDocNamesTheAPI: the package doc (doc.go) links every exported
// interface of the package (the API and the hooks) and every Validate
// function (the toolkit), so a new one cannot be left out of its lists.
func TestPackageDocNamesTheAPI(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if ts, ok := s.(*ast.TypeSpec); ok && ts.Name.IsExported() {
						if _, ok := ts.Type.(*ast.InterfaceType); ok {
							names = append(names, ts.Name.Name)
						}
					}
				}
			case *ast.FuncDecl:
				if d.Recv == nil && strings.HasPrefix(d.Name.Name, "Validate") {
					names = append(names, d.Name.Name)
				}
			}
		}
	}
	if len(names) < 10 {
		t.Fatalf("found %d interfaces and Validate functions, want the package's (at least 10)", len(names))
	}
	for _, name := range names {
		if !strings.Contains(string(doc), "["+name+"]") {
			t.Errorf("doc.go does not name [%s]", name)
		}
	}
}
