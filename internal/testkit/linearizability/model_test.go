package linearizability

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"

	"github.com/zlink-systems/authority"
)

// do records a call of client that returns out before anything else happens.
func do(h *History, client int, in Input, out Output) {
	h.Return(h.Call(client, in), out)
}

func read(key string) Input { return Input{Op: OpRead, Key: key} }
func put(key, expected, payload string) Input {
	return Input{Op: OpPut, Key: key, Expected: expected, Payload: payload}
}
func del(key, expected string) Input    { return Input{Op: OpDelete, Key: key, Expected: expected} }
func reserve(key, payload string) Input { return Input{Op: OpReserve, Key: key, Payload: payload} }
func commit(key, id, expected, payload string) Input {
	return Input{Op: OpCommit, Key: key, ReservationID: id, Expected: expected, Payload: payload}
}
func abort(key, id, expected string) Input {
	return Input{Op: OpAbort, Key: key, ReservationID: id, Expected: expected}
}

func kind(k authority.ResultKind) Output { return Output{Kind: k} }
func active(p string) Row                { return Row{State: Active, Payload: p} }
func reserved(p, id string) Row          { return Row{State: Reserved, Payload: p, ReservationID: id} }
func seen(k authority.ResultKind, r Row) Output {
	return Output{Kind: k, Row: r}
}

// verdictOf checks h and removes any visualization file.
func verdictOf(t *testing.T, h *History) porcupine.CheckResult {
	t.Helper()
	result, path, err := Verdict(h, 0)
	require.NoError(t, err)
	if path != "" {
		require.NoError(t, os.Remove(path))
	}
	return result
}

// createActive records reserve + commit of key with payloads p0 → p1 by
// client 0.
func createActive(h *History, key, id, p0, p1 string) {
	do(h, 0, reserve(key, p0), seen(authority.KindReserved, reserved(p0, id)))
	do(h, 0, commit(key, id, p0, p1), seen(authority.KindCommitted, active(p1)))
}

func TestLinearizableHistoryPasses(t *testing.T) {
	h := &History{}
	do(h, 0, read("a"), kind(authority.KindMissing))
	createActive(h, "a", "r1", "a0", "a1")
	do(h, 1, commit("a", "r1", "a0", "a1-again"), seen(authority.KindAlreadyCommitted, active("a1")))

	// Concurrent put and reads: the reads may see either side.
	w := h.Call(1, put("a", "a1", "a2"))
	r1 := h.Call(2, read("a"))
	r2 := h.Call(3, read("a"))
	h.Return(r1, seen(authority.KindSnapshot, active("a2")))
	h.Return(w, kind(authority.KindStored)) // row implied by the input
	h.Return(r2, seen(authority.KindSnapshot, active("a1")))

	do(h, 2, put("a", "a1", "lost"), seen(authority.KindConflict, active("a2")))
	do(h, 2, reserve("a", "nope"), seen(authority.KindAlreadyExists, active("a2")))
	do(h, 1, del("a", "a2"), kind(authority.KindDeleted))
	do(h, 2, del("a", "a2"), seen(authority.KindConflict, Row{}))
	do(h, 3, read("a"), kind(authority.KindMissing))

	// A second key, independent: reserve, conflicting reserve, abort twice,
	// commit after abort is stale, the key can be reserved again.
	do(h, 0, reserve("b", "b0"), seen(authority.KindReserved, reserved("b0", "r2")))
	do(h, 1, reserve("b", "b-other"), seen(authority.KindConflict, reserved("b0", "")))
	do(h, 1, read("b"), seen(authority.KindSnapshot, reserved("b0", "r2")))
	do(h, 0, abort("b", "r2", "b0"), kind(authority.KindAborted))
	do(h, 1, abort("b", "r2", "b0"), kind(authority.KindAlreadyAborted))
	do(h, 1, commit("b", "r2", "b0", "b1"), kind(authority.KindStale))
	do(h, 2, reserve("b", "b2"), seen(authority.KindReserved, reserved("b2", "r3")))
	do(h, 2, abort("b", "r2", "b2"), kind(authority.KindAlreadyAborted))
	do(h, 2, commit("b", "r3", "b0", "b3"), kind(authority.KindStale)) // wrong expected version
	do(h, 2, commit("b", "r3", "b2", "b3"), seen(authority.KindCommitted, active("b3")))
	do(h, 0, abort("b", "r3", "b2"), kind(authority.KindStale))

	require.Equal(t, porcupine.Ok, verdictOf(t, h))
	require.True(t, Check(t, h))
}

func TestStaleReadAfterAcknowledgedWriteFails(t *testing.T) {
	h := &History{}
	createActive(h, "a", "r1", "a0", "a1")
	do(h, 0, put("a", "a1", "a2"), kind(authority.KindStored))
	do(h, 1, read("a"), seen(authority.KindSnapshot, active("a1"))) // after the ack: stale
	require.Equal(t, porcupine.Illegal, verdictOf(t, h))
}

func TestDuplicateCommitSuccessFails(t *testing.T) {
	t.Run("sequential", func(t *testing.T) {
		h := &History{}
		createActive(h, "a", "r1", "a0", "a1")
		do(h, 1, commit("a", "r1", "a0", "a1"), seen(authority.KindCommitted, active("a1")))
		require.Equal(t, porcupine.Illegal, verdictOf(t, h))
	})
	t.Run("concurrent", func(t *testing.T) {
		h := &History{}
		do(h, 0, reserve("a", "a0"), seen(authority.KindReserved, reserved("a0", "r1")))
		c1 := h.Call(1, commit("a", "r1", "a0", "x"))
		c2 := h.Call(2, commit("a", "r1", "a0", "y"))
		h.Return(c1, kind(authority.KindCommitted))
		h.Return(c2, kind(authority.KindCommitted))
		require.Equal(t, porcupine.Illegal, verdictOf(t, h))
	})
	t.Run("concurrent, one alreadyCommitted", func(t *testing.T) {
		h := &History{}
		do(h, 0, reserve("a", "a0"), seen(authority.KindReserved, reserved("a0", "r1")))
		c1 := h.Call(1, commit("a", "r1", "a0", "x"))
		c2 := h.Call(2, commit("a", "r1", "a0", "y"))
		h.Return(c2, seen(authority.KindAlreadyCommitted, active("x")))
		h.Return(c1, kind(authority.KindCommitted))
		require.Equal(t, porcupine.Ok, verdictOf(t, h))
	})
	t.Run("abort after commit", func(t *testing.T) {
		h := &History{}
		createActive(h, "a", "r1", "a0", "a1")
		do(h, 1, abort("a", "r1", "a0"), kind(authority.KindAborted))
		require.Equal(t, porcupine.Illegal, verdictOf(t, h))
	})
}

func TestUnknownWriteLaterObservedPasses(t *testing.T) {
	h := &History{}
	createActive(h, "a", "r1", "a0", "a1")
	h.Unknown(h.Call(1, put("a", "a1", "a2"))) // timed out
	do(h, 2, read("a"), seen(authority.KindSnapshot, active("a1")))
	do(h, 2, read("a"), seen(authority.KindSnapshot, active("a2"))) // it happened after all
	do(h, 2, put("a", "a2", "a3"), kind(authority.KindStored))
	require.Equal(t, porcupine.Ok, verdictOf(t, h))
}

func TestUnknownWriteNeverObservedPasses(t *testing.T) {
	h := &History{}
	createActive(h, "a", "r1", "a0", "a1")
	h.Unknown(h.Call(1, put("a", "a1", "a2")))
	do(h, 2, read("a"), seen(authority.KindSnapshot, active("a1")))
	do(h, 2, del("a", "a1"), kind(authority.KindDeleted))
	do(h, 2, read("a"), kind(authority.KindMissing))
	require.Equal(t, porcupine.Ok, verdictOf(t, h))
}

func TestPendingCallCountsAsUnknown(t *testing.T) {
	h := &History{}
	createActive(h, "a", "r1", "a0", "a1")
	h.Call(1, put("a", "a1", "a2")) // never returned
	do(h, 2, read("a"), seen(authority.KindSnapshot, active("a2")))
	require.Equal(t, porcupine.Ok, verdictOf(t, h))
}

func TestUnknownWriteCannotUnhappen(t *testing.T) {
	h := &History{}
	createActive(h, "a", "r1", "a0", "a1")
	h.Unknown(h.Call(1, put("a", "a1", "a2")))
	do(h, 2, read("a"), seen(authority.KindSnapshot, active("a2")))
	do(h, 2, read("a"), seen(authority.KindSnapshot, active("a1")))
	require.Equal(t, porcupine.Illegal, verdictOf(t, h))
}

func TestUnknownCommitRetriedIsAlreadyCommitted(t *testing.T) {
	// The ambiguous-commit pattern: the reply is lost, the retry answers
	// alreadyCommitted with the row the lost commit wrote.
	h := &History{}
	do(h, 0, reserve("a", "a0"), seen(authority.KindReserved, reserved("a0", "r1")))
	h.Unknown(h.Call(0, commit("a", "r1", "a0", "a1")))
	do(h, 0, commit("a", "r1", "a0", "a1-retry"), seen(authority.KindAlreadyCommitted, active("a1")))
	require.Equal(t, porcupine.Ok, verdictOf(t, h))

	// A retry that commits again on top of a lost commit that was observed
	// is a duplicate creation.
	h = &History{}
	do(h, 0, reserve("a", "a0"), seen(authority.KindReserved, reserved("a0", "r1")))
	h.Unknown(h.Call(0, commit("a", "r1", "a0", "a1")))
	do(h, 1, read("a"), seen(authority.KindSnapshot, active("a1")))
	do(h, 0, commit("a", "r1", "a0", "a1-retry"), kind(authority.KindCommitted))
	require.Equal(t, porcupine.Illegal, verdictOf(t, h))
}

func TestUnknownReserveResolvedByObservation(t *testing.T) {
	h := &History{}
	h.Unknown(h.Call(0, reserve("a", "a0")))
	do(h, 1, read("a"), seen(authority.KindSnapshot, reserved("a0", "r9")))
	do(h, 1, commit("a", "r9", "a0", "a1"), kind(authority.KindCommitted))
	do(h, 2, commit("a", "r9", "a0", "a1"), seen(authority.KindAlreadyCommitted, active("a1")))
	require.Equal(t, porcupine.Ok, verdictOf(t, h))

	// Once resolved, the ID is fixed: another ID cannot commit it.
	h = &History{}
	h.Unknown(h.Call(0, reserve("a", "a0")))
	do(h, 1, read("a"), seen(authority.KindSnapshot, reserved("a0", "r9")))
	do(h, 1, commit("a", "other", "a0", "a1"), kind(authority.KindCommitted))
	require.Equal(t, porcupine.Illegal, verdictOf(t, h))
}

func TestWrongConflictObservationFails(t *testing.T) {
	h := &History{}
	createActive(h, "a", "r1", "a0", "a1")
	do(h, 1, put("a", "a1", "a2"), seen(authority.KindConflict, active("a1"))) // expected matched
	require.Equal(t, porcupine.Illegal, verdictOf(t, h))

	h = &History{}
	createActive(h, "a", "r1", "a0", "a1")
	do(h, 1, put("a", "zz", "a2"), seen(authority.KindConflict, active("a0"))) // wrong current
	require.Equal(t, porcupine.Illegal, verdictOf(t, h))

	h = &History{}
	createActive(h, "a", "r1", "a0", "a1")
	do(h, 1, put("a", "a1", "a2"), seen(authority.KindStored, active("other"))) // wrong written row
	require.Equal(t, porcupine.Illegal, verdictOf(t, h))
}

// failTB records Check's failure instead of failing the test.
type failTB struct {
	testing.TB
	errors []string
}

func (f *failTB) Helper()             {}
func (f *failTB) Logf(string, ...any) {}
func (f *failTB) Errorf(format string, args ...any) {
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}

func TestCheckFailsAndNamesVisualization(t *testing.T) {
	h := &History{}
	createActive(h, "a", "r1", "a0", "a1")
	do(h, 0, put("a", "a1", "a2"), kind(authority.KindStored))
	do(h, 1, read("a"), seen(authority.KindSnapshot, active("a1")))

	ft := &failTB{TB: t}
	require.False(t, Check(ft, h))
	require.Len(t, ft.errors, 1)
	msg := ft.errors[0]
	require.Contains(t, msg, "not linearizable")
	i := strings.Index(msg, "visualization: ")
	require.GreaterOrEqual(t, i, 0, msg)
	path := strings.TrimSpace(msg[i+len("visualization: "):])
	t.Cleanup(func() { _ = os.Remove(path) })
	html, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, strings.ToLower(string(html)), "<html")
	require.Contains(t, string(html), "read(a)", "operations are described")
}

func TestOperationsLanesAndUnknownReturn(t *testing.T) {
	h := &History{}
	do(h, 7, read("a"), kind(authority.KindMissing))
	h.Unknown(h.Call(7, reserve("a", "a0")))
	do(h, 7, read("a"), kind(authority.KindMissing))
	do(h, 3, read("a"), kind(authority.KindMissing))
	ops := h.Operations()
	require.Len(t, ops, 4)
	require.Equal(t, 4, h.Len())
	require.Equal(t, 0, ops[0].ClientId)
	require.Equal(t, 0, ops[1].ClientId, "the unknown op stays in its client's lane")
	require.Equal(t, 1, ops[2].ClientId, "the next op of that client moves to a new lane")
	require.Equal(t, 2, ops[3].ClientId)
	require.True(t, ops[1].Output.(Output).Unknown)
	for _, op := range ops {
		require.Less(t, op.Call, op.Return)
		require.LessOrEqual(t, op.Return, ops[1].Return, "an unknown op returns after everything")
	}
	require.Panics(t, func() { h.Return(1, kind(authority.KindMissing)) })
}
