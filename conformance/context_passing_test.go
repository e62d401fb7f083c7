package conformance_test

import (
	"context"
	"sync/atomic"
	"testing"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
)

// ctxKey marks the context a test passes to the suite.
type ctxKey struct{}

// ctxRecordingStore counts the calls whose context carries ctxKey and the
// calls whose context does not, on the operations it overrides.
type ctxRecordingStore struct {
	authority.Store
	with, without atomic.Int64
}

func (s *ctxRecordingStore) seen(ctx context.Context) {
	if ctx.Value(ctxKey{}) == "suite" {
		s.with.Add(1)
	} else {
		s.without.Add(1)
	}
}

func (s *ctxRecordingStore) ReadAuthority(ctx context.Context, key authority.Key) (authority.ReadResult, error) {
	s.seen(ctx)
	return s.Store.ReadAuthority(ctx, key)
}

func (s *ctxRecordingStore) Reserve(ctx context.Context, req authority.ReserveRequest) (authority.ReserveResult, error) {
	s.seen(ctx)
	return s.Store.Reserve(ctx, req)
}

func (s *ctxRecordingStore) Commit(ctx context.Context, req authority.CommitRequest) (authority.CommitResult, error) {
	s.seen(ctx)
	return s.Store.Commit(ctx, req)
}

// TestSuiteRunsOnTheCallersContext checks that the suite runs operations on
// the context its caller passes (its values reach the store), and that a
// fixture's context ends with its test.
func TestSuiteRunsOnTheCallersContext(t *testing.T) {
	rec := &ctxRecordingStore{}
	factory := func(t *testing.T) *conformance.Harness {
		h := memoryFactory(t)
		rec.Store = h.Store
		h.Store = rec
		return h
	}
	ctx := context.WithValue(t.Context(), ctxKey{}, "suite")
	t.Run("Commit", func(t *testing.T) { conformance.RunTestCommit(ctx, t, factory) })
	if rec.with.Load() == 0 || rec.without.Load() != 0 {
		t.Fatalf("operations on the caller's context: %d, on another: %d", rec.with.Load(), rec.without.Load())
	}

	var fxCtx context.Context
	t.Run("FixtureContextEndsWithItsTest", func(t *testing.T) {
		fx := conformance.NewFixtureContext(ctx, t, memoryFactory(t))
		fxCtx = fx.Ctx()
		if fxCtx.Value(ctxKey{}) != "suite" || fxCtx.Err() != nil {
			t.Fatalf("fixture context: value %v, err %v", fxCtx.Value(ctxKey{}), fxCtx.Err())
		}
	})
	if fxCtx.Err() == nil {
		t.Fatal("a fixture's context outlives its test")
	}
}
