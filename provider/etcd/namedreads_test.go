package etcd_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// positionalRead is a Txn response read by where it sits.
var positionalRead = regexp.MustCompile(`\.Responses\[`)

// TestNoTxnResponseReadByPosition: outside internal/txnkit (whose
// RangeRead handles are the one place that indexes Responses), no code of
// provider/ reads a Txn's response by its position: a read is found by the
// key it read (txnkit.Reads, txnkit.KVNamed) or by the handle that added it
// (txnkit.AddRead), so adding or reordering the ops of a Txn cannot make
// another read answer in its place.
func TestNoTxnResponseReadByPosition(t *testing.T) {
	kit := filepath.Join("internal", "txnkit")
	var found []string
	scanned := 0
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") ||
			strings.Contains(path, string(filepath.Separator)+kit+string(filepath.Separator)) {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		scanned++
		for i, line := range strings.Split(string(src), "\n") {
			if positionalRead.MatchString(line) {
				found = append(found, path+":"+strconv.Itoa(i+1)+": "+strings.TrimSpace(line))
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, scanned, 40, "it scanned provider/'s files")
	require.Empty(t, found, "Txn responses read by position; use txnkit.ReadsOf, txnkit.KVNamed or txnkit.AddRead")
}
