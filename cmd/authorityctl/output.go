package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"go.yaml.in/yaml/v3"
)

// Output formats of -o.
const (
	outputTable = "table"
	outputWide  = "wide"
	outputJSON  = "json"
	outputYAML  = "yaml"
)

var outputFormats = []string{outputTable, outputWide, outputJSON, outputYAML}

// table is a command's tabular view: the columns of -o table, plus the extra
// columns of -o wide (wide cells follow the narrow cells in each row).
type table struct {
	header []string
	wide   []string
	rows   [][]string
	// before is a table printed ahead of this one, then a blank line.
	before *table
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

// render writes v (json, yaml) or t (table, wide) to w in the given format.
func render(w io.Writer, format string, v any, t *table) error {
	switch format {
	case outputJSON:
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case outputYAML:
		b, err := toYAML(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	return writeTable(w, t, format == outputWide)
}

func writeTable(w io.Writer, t *table, wide bool) error {
	if t.before != nil {
		if err := writeTable(w, t.before, wide); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	n := len(t.header)
	header := t.header
	if wide {
		header = append(append([]string(nil), t.header...), t.wide...)
		n = len(header)
	}
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range t.rows {
		cells := r
		if len(cells) > n {
			cells = cells[:n]
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// toYAML renders v as block-style YAML with the field names of its JSON
// encoding (one source of truth for names, times as RFC 3339 text).
func toYAML(v any) ([]byte, error) {
	j, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var n yaml.Node
	if err := yaml.Unmarshal(j, &n); err != nil {
		return nil, err
	}
	blockStyle(&n)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&n); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func blockStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		blockStyle(c)
	}
}

// age formats a duration for tables, kubectl-style: "42s", "3m12s", "5h3m",
// "2d4h". Negative durations are formatted as their magnitude.
func age(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	d = d.Round(time.Second)
	s := int64(d / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%ds", s/60, s%60)
	case s < 86400:
		return fmt.Sprintf("%dh%dm", s/3600, (s%3600)/60)
	}
	return fmt.Sprintf("%dd%dh", s/86400, (s%86400)/3600)
}

// until formats the time left before t for tables ("expired 3s ago" once
// past).
func until(t, now time.Time) string {
	if d := t.Sub(now); d > 0 {
		return age(d)
	}
	return "expired " + age(now.Sub(t)) + " ago"
}

// rfc3339 formats t for JSON and YAML (UTC, millisecond precision).
func rfc3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Truncate(time.Millisecond).Format("2006-01-02T15:04:05.000Z07:00")
}

// orDash returns s, or "-" for an empty cell.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// itemsView is the JSON/YAML form of every command that lists things:
// {"items": [...]} (list adds "more").
type itemsView[T any] struct {
	Items []T `json:"items"`
}
