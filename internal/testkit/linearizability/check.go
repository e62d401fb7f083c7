package linearizability

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// DefaultTimeout bounds Check's search; a history it cannot decide in time
// fails the test as undecided.
const DefaultTimeout = time.Minute

// Verdict checks h against Model within timeout (0: no limit). Unless the
// result is porcupine.Ok it writes porcupine's HTML visualization to a new
// temporary file (kept after the test) and returns its path.
func Verdict(h *History, timeout time.Duration) (porcupine.CheckResult, string, error) {
	return verdict(h.Operations(), timeout)
}

func verdict(ops []porcupine.Operation, timeout time.Duration) (porcupine.CheckResult, string, error) {
	result, info := porcupine.CheckOperationsVerbose(Model, ops, timeout)
	if result == porcupine.Ok {
		return result, "", nil
	}
	f, err := os.CreateTemp("", "linearizability-*.html")
	if err != nil {
		return result, "", fmt.Errorf("linearizability: visualization file: %w", err)
	}
	path := f.Name()
	if err := porcupine.Visualize(Model, info, f); err != nil {
		_ = f.Close()
		return result, path, fmt.Errorf("linearizability: visualize: %w", err)
	}
	if err := f.Close(); err != nil {
		return result, path, err
	}
	return result, path, nil
}

// Check fails t (Errorf) unless h is linearizable under Model, naming the
// visualization file in the failure message. It reports whether h passed.
// It logs the number of operations and how many had unknown outcomes.
func Check(t testing.TB, h *History) bool {
	t.Helper()
	ops := h.Operations()
	unknown := 0
	for _, op := range ops {
		if op.Output.(Output).Unknown {
			unknown++
		}
	}
	result, path, err := verdict(ops, DefaultTimeout)
	switch {
	case err != nil:
		t.Errorf("linearizability: %v (result %s)", err, result)
		return false
	case result == porcupine.Illegal:
		t.Errorf("linearizability: history of %d operations (%d unknown) is not linearizable; visualization: %s",
			len(ops), unknown, path)
		return false
	case result != porcupine.Ok:
		t.Errorf("linearizability: undecided within %v (%s) for %d operations (%d unknown); visualization: %s",
			DefaultTimeout, result, len(ops), unknown, path)
		return false
	}
	t.Logf("linearizability: ok, operations=%d unknown=%d", len(ops), unknown)
	return true
}
