package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDemoLegendMatchesTable: each example value the demo's legend gives
// (OWNER, TOKEN, NODE, VERSION) is the value of one row of the list table
// printed above it, all of the same row, and its "inbox replayed" example is
// a row's.
func TestDemoLegendMatchesTable(t *testing.T) {
	out, errOut, code := cli(t, nil, "demo", "--data-dir", t.TempDir())
	require.Equal(t, 0, code, errOut)
	_, listing, ok := strings.Cut(out, "$ authorityctl list\n")
	require.True(t, ok, "no list table:\n%s", out)
	listing, _, _ = strings.Cut(listing, "\n\n")
	lines := strings.Split(listing, "\n")
	cells := regexp.MustCompile(` {2,}`)
	header := cells.Split(lines[0], -1)
	var rows []map[string]string
	for _, line := range lines[1:] {
		row := map[string]string{}
		for i, cell := range cells.Split(line, -1) {
			if i < len(header) {
				row[header[i]] = cell
			}
		}
		rows = append(rows, row)
	}
	require.NotEmpty(t, rows, "the list table has no rows:\n%s", out)

	_, legend, ok := strings.Cut(out, "\nReading the tables")
	require.True(t, ok, "no legend:\n%s", out)
	example := map[string]string{}
	for _, term := range []string{"OWNER", "TOKEN", "NODE", "VERSION"} {
		m := regexp.MustCompile(`(?m)^  ` + term + ` (\S+) `).FindStringSubmatch(legend)
		require.NotNil(t, m, "the legend has no %s example:\n%s", term, legend)
		example[term] = m[1]
	}
	matched := false
	for _, row := range rows {
		if row["OWNER"] == example["OWNER"] && row["TOKEN"] == example["TOKEN"] &&
			row["NODE"] == example["NODE"] && row["VERSION"] == example["VERSION"] {
			matched = true
		}
	}
	require.True(t, matched, "no row of the table has the legend's OWNER %s, TOKEN %s, NODE %s and VERSION %s:\n%s",
		example["OWNER"], example["TOKEN"], example["NODE"], example["VERSION"], out)
	if m := regexp.MustCompile(`(?m)^  (inbox replayed \d+/\d+) `).FindStringSubmatch(legend); m != nil {
		require.Contains(t, listing, m[1], "the legend's %q is no row's", m[1])
	}
}
