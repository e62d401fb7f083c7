package main

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// readmeSection returns the README's "## authorityctl" section.
func readmeSection(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n## authorityctl\n")
	if !ok {
		t.Fatal("README.md has no \"## authorityctl\" section")
	}
	section, _, _ := strings.Cut(rest, "\n## ")
	return section
}

// readmeRow returns the README table row of the command at path (its first
// cell names the path in backticks).
func readmeRow(section, path string) string {
	for _, l := range strings.Split(section, "\n") {
		first, _, _ := strings.Cut(strings.TrimPrefix(l, "| "), " | ")
		if strings.HasPrefix(l, "| ") && (strings.Contains(first, "`"+path+" ") || strings.Contains(first, "`"+path+"`")) {
			return l
		}
	}
	return ""
}

// TestDocsNameEveryWritingCommand: the commands that write are those the
// cobra tree annotates (annotationWrites); the root --help and the README's
// introduction of authorityctl name each, and the README's row of each
// names every one of its flags (--yes, --dry-run, --force…). Every command
// has a README row.
func TestDocsNameEveryWritingCommand(t *testing.T) {
	section := readmeSection(t)
	intro, _, _ := strings.Cut(section, "\n| ")
	help, _, code := cli(t, nil, "--help")
	if code != 0 {
		t.Fatalf("--help exits %d", code)
	}
	root := newRootCommand(nil, nil, nil)
	writers := 0
	for path, c := range leafCommands(root) {
		row := readmeRow(section, path)
		if row == "" {
			t.Errorf("README's authorityctl table has no row for %q", path)
			continue
		}
		if !writes(c) {
			continue
		}
		writers++
		if !strings.Contains(help, "\n  "+path+" ") {
			t.Errorf("root --help does not list %q among the commands that write", path)
		}
		if !strings.Contains(intro, "`"+path+"`") {
			t.Errorf("README's authorityctl introduction does not name %q among the commands that write", path)
		}
		c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
			if f.Name != "help" && !strings.Contains(row, "--"+f.Name) {
				t.Errorf("README's row of %q does not mention its flag --%s: %s", path, f.Name, row)
			}
		})
	}
	if writers == 0 {
		t.Fatal("no command is annotated as writing")
	}
}

// TestDocsListEveryExitCode: the root --help, the README's exit code table
// and deviation A6 list every exit code the CLI uses.
func TestDocsListEveryExitCode(t *testing.T) {
	codes := []int{exitOK, exitFailure, exitUsage, exitConnect, exitInterrupted}
	help := newRootCommand(nil, nil, nil).Long
	readme := readmeSection(t)
	dev, err := os.ReadFile("../../docs/deviations.md")
	if err != nil {
		t.Fatal(err)
	}
	var a6 string
	for _, l := range strings.Split(string(dev), "\n") {
		if strings.HasPrefix(l, "| A6 |") {
			a6 = l
		}
	}
	for _, code := range codes {
		if !strings.Contains(help, fmt.Sprintf("\n  %d  ", code)) {
			t.Errorf("root --help does not list exit code %d", code)
		}
		if !strings.Contains(readme, fmt.Sprintf("\n| %d |", code)) {
			t.Errorf("README's exit code table does not list %d", code)
		}
		if !strings.Contains(a6, fmt.Sprintf(" %d ", code)) {
			t.Errorf("deviation A6 does not list exit code %d: %s", code, a6)
		}
	}
}
