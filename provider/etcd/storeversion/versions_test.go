package storeversion

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"testing"
)

// TestVersionsAscend checks that the versions this build knows are the
// names table in order, one higher each, from Base, and that MinSupported
// and Latest bound them.
func TestVersionsAscend(t *testing.T) {
	if len(names) == 0 || names[0].v != Base {
		t.Fatalf("names starts at %v, want Base (%d)", names, Base)
	}
	seen := map[string]bool{}
	for i, n := range names {
		if i > 0 && n.v != names[i-1].v+1 {
			t.Errorf("names[%d] is version %d after %d: versions go up by one", i, n.v, names[i-1].v)
		}
		if n.name == "" || seen[n.name] {
			t.Errorf("names[%d] (version %d) has name %q: names are non-empty and unique", i, n.v, n.name)
		}
		seen[n.name] = true
	}
	if MinSupported < Base || MinSupported > Latest {
		t.Fatalf("MinSupported %d is outside [Base %d, Latest %d]", MinSupported, Base, Latest)
	}
	if Latest > names[len(names)-1].v {
		t.Fatalf("Latest %d has no entry in names (newest %d)", Latest, names[len(names)-1].v)
	}
	for v := MinSupported - 1; v <= Latest+1; v++ {
		want := v >= MinSupported && v <= Latest
		if Known(v) != want {
			t.Errorf("Known(%d) = %v, want %v (MinSupported %d, Latest %d)", v, Known(v), want, MinSupported, Latest)
		}
	}
}

// TestStringNamesKnownVersions checks String: number and name for a version
// this build knows, the number alone for any other.
func TestStringNamesKnownVersions(t *testing.T) {
	for _, n := range names {
		want := strconv.Itoa(int(n.v))
		if Known(n.v) {
			want += " (" + n.name + ")"
		}
		if got := n.v.String(); got != want {
			t.Errorf("Version(%d).String() = %q, want %q", n.v, got, want)
		}
	}
	if got, want := (Latest + 1).String(), strconv.Itoa(int(Latest)+1); got != want {
		t.Errorf("(Latest+1).String() = %q, want %q", got, want)
	}
}

// TestNextPretendIsNewest checks that the test-only version is beyond every
// other: a released build (Latest below it) can never read what it writes.
func TestNextPretendIsNewest(t *testing.T) {
	if last := names[len(names)-1]; last.v != NextPretend {
		t.Fatalf("the newest version is %d (%s), want NextPretend (%d)", last.v, last.name, NextPretend)
	}
	if Latest != NextPretend && Latest != NextPretend-1 {
		t.Fatalf("Latest is %d: want NextPretend (%d) in a test build or the version before it in a released one", Latest, NextPretend)
	}
	if Latest == NextPretend != pretendBuild {
		t.Fatalf("Latest is %d in a build with tag authority_next %v: NextPretend (%d) is Latest exactly under the tag", Latest, pretendBuild, NextPretend)
	}
}

// TestNamesAreTheConstants reads versions.go: every constant of type
// Version has one entry in names, in declaration order, whose name is the
// constant's identifier (so a name typed beside its constant cannot drift
// from it).
func TestNamesAreTheConstants(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "versions.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var constants, entries []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, spec := range g.Specs {
			v, ok := spec.(*ast.ValueSpec)
			if !ok {
				continue
			}
			if typ, ok := v.Type.(*ast.Ident); ok && typ.Name == "Version" && g.Tok == token.CONST {
				for _, id := range v.Names {
					constants = append(constants, id.Name)
				}
			}
			if g.Tok == token.VAR && len(v.Names) == 1 && v.Names[0].Name == "names" {
				entries = namesEntries(t, v)
			}
		}
	}
	if len(constants) == 0 || len(entries) == 0 {
		t.Fatalf("found constants %v and names entries %v in versions.go: want both", constants, entries)
	}
	if len(constants) != len(entries) {
		t.Fatalf("constants of type Version %v, names entries %v: want one entry each", constants, entries)
	}
	for i := range constants {
		if constants[i] != entries[i] {
			t.Errorf("names[%d] is %s, want %s (the constants' order)", i, entries[i], constants[i])
		}
	}
}

// namesEntries returns, for each element {Constant, "Name"} of the names
// literal, its constant's identifier, failing when Name differs from it.
func namesEntries(t *testing.T, v *ast.ValueSpec) []string {
	t.Helper()
	lit, ok := v.Values[0].(*ast.CompositeLit)
	if !ok {
		t.Fatalf("names is not a composite literal")
	}
	var out []string
	for i, e := range lit.Elts {
		el, ok := e.(*ast.CompositeLit)
		if !ok || len(el.Elts) != 2 {
			t.Fatalf("names[%d] is not {Constant, \"Name\"}", i)
		}
		id, okID := el.Elts[0].(*ast.Ident)
		str, okStr := el.Elts[1].(*ast.BasicLit)
		if !okID || !okStr || str.Kind != token.STRING {
			t.Fatalf("names[%d] is not {Constant, \"Name\"}", i)
		}
		name, err := strconv.Unquote(str.Value)
		if err != nil {
			t.Fatalf("names[%d]: %v", i, err)
		}
		if name != id.Name {
			t.Errorf("names[%d] names constant %s %q", i, id.Name, name)
		}
		out = append(out, id.Name)
	}
	return out
}
