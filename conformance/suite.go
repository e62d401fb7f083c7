package conformance

import (
	"context"
	"testing"
)

// RunAll runs every conformance test against stores made by f, each area as a
// subtest named after it, so every provider reports the same subtest names.
// Every operation runs on a context derived from ctx (its values and
// deadline) that also ends when its subtest ends; pass t.Context().
func RunAll(ctx context.Context, t *testing.T, f Factory) {
	t.Helper()
	areas := []struct {
		name string
		run  func(context.Context, *testing.T, Factory)
	}{
		{"ReadAuthority", RunTestReadAuthority},
		{"Reserve", RunTestReserve},
		{"Commit", RunTestCommit},
		{"Abort", RunTestAbort},
		{"CompleteCreation", RunTestCompleteCreation},
		{"CreationTerminal", RunTestCreationTerminal},
		{"CompareExchange", RunTestCompareExchange},
		{"RemoveAllByOwner", RunTestRemoveAllByOwner},
		{"Capacity", RunTestCapacity},
		{"AggregatePrepare", RunTestAggregatePrepare},
		{"AggregateCommit", RunTestAggregateCommit},
		{"AggregateAbort", RunTestAggregateAbort},
		{"AggregatePolicy", RunTestAggregatePolicy},
		{"List", RunTestList},
		{"Validation", RunTestValidation},
		{"Context", RunTestContext},
		{"Concurrency", RunTestConcurrency},
		{"WaitForChange", RunTestWaitForChange},
		{"RelocationStore", RunTestRelocationStore},
		{"Retention", RunTestRetention},
		{"GenerationExhausted", RunTestGenerationExhausted},
		{"OwnershipToken", RunTestOwnershipToken},
		{"ClockStepBack", RunTestClockStepBack},
	}
	for _, a := range areas {
		t.Run(a.name, func(t *testing.T) { a.run(ctx, t, f) })
	}
}

// subtest is one named conformance check run on a fresh store.
type subtest struct {
	name string
	run  func(t *testing.T, fx *Fixture)
}

// runSubtests runs each test as a subtest with a fresh harness from f and a
// fixture whose operations run on a context derived from ctx.
func runSubtests(ctx context.Context, t *testing.T, f Factory, tests []subtest) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := f(t)
			if reason, ok := h.skipped(t.Name()); ok {
				t.Skip(reason)
			}
			tc.run(t, NewFixtureContext(ctx, t, h))
		})
	}
}

// needCapacityPolicy skips t when the provider cannot change its policy.
func needCapacityPolicy(t *testing.T, fx *Fixture) {
	t.Helper()
	if fx.H.SetCapacityPolicy == nil {
		t.Skip("provider cannot set a capacity policy")
	}
}

// needClock skips t when the provider cannot advance its clock.
func needClock(t *testing.T, fx *Fixture) {
	t.Helper()
	if fx.H.AdvanceClock == nil {
		t.Skip("provider cannot advance its clock")
	}
}

// needGenerations skips t when the provider cannot move its counters.
func needGenerations(t *testing.T, fx *Fixture) {
	t.Helper()
	if fx.H.LeaveGenerations == nil {
		t.Skip("provider cannot move its generation counters")
	}
}
