package observe

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// TestNewContractNamesAMissingOperation: a provider that leaves an
// operation of Work unset fails when its store is built, naming the field,
// not on the first call.
func TestNewContractNamesAMissingOperation(t *testing.T) {
	require.PanicsWithValue(t, "observe: Work.ReadAuthority is nil", func() { NewContract(nil, Work{}) })
}

// TestContractRecordsEachOperation: an operation through the contract runs
// its work and counts under its own name with the work's outcome kind.
func TestContractRecordsEachOperation(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	w := Work{
		ReadAuthority: func(context.Context, authority.Key) (authority.ReadResult, error) {
			return authority.ReadResult{Kind: authority.KindMissing}, nil
		},
		CompareExchangeAuthority: func(context.Context, authority.Key, authority.StoreVersion, authority.Mutation) (authority.CompareExchangeResult, error) {
			return authority.CompareExchangeResult{}, nil
		},
		ListAuthorities: func(context.Context, string, authority.ScanCursor, int) (authority.ScanResult, error) {
			return authority.ScanResult{}, nil
		},
		RemoveAllByOwner: func(context.Context, authority.OwnerToken) (int64, error) { return 0, nil },
		Reserve: func(context.Context, authority.ReserveRequest) (authority.ReserveResult, error) {
			return authority.ReserveResult{}, nil
		},
		Commit: func(context.Context, authority.CommitRequest) (authority.CommitResult, error) {
			return authority.CommitResult{}, nil
		},
		CompleteCreation: func(context.Context, authority.CompleteCreationRequest) (authority.CompleteCreationResult, error) {
			return authority.CompleteCreationResult{}, nil
		},
		ReadCreationTerminal: func(context.Context, authority.CreationOperation) (authority.TerminalReadResult, error) {
			return authority.TerminalReadResult{}, nil
		},
		Abort: func(context.Context, authority.AbortRequest) (authority.AbortResult, error) {
			return authority.AbortResult{}, nil
		},
		PrepareAggregate: func(context.Context, authority.AggregatePrepareRequest) (authority.PrepareAggregateResult, error) {
			return authority.PrepareAggregateResult{}, nil
		},
		CommitAggregate: func(context.Context, authority.Fence) (authority.CommitAggregateResult, error) {
			return authority.CommitAggregateResult{}, nil
		},
		AbortAggregate: func(context.Context, authority.Fence) (authority.AbortAggregateResult, error) {
			return authority.AbortAggregateResult{}, nil
		},
		CapacityUsage: func(context.Context, authority.NodeDescriptor, int64, authority.ObjectKind, string) (authority.CapacityUsage, error) {
			return authority.CapacityUsage{}, nil
		},
		WaitForChange: func(context.Context, authority.Key, authority.StoreVersion) error { return nil },
	}
	c := NewContract(New(Config{Registerer: reg}), w)
	ctx := t.Context()
	res, err := c.ReadAuthority(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, authority.KindMissing, res.Kind)
	_, _ = c.CompareExchangeAuthority(ctx, "k", "", authority.Mutation{})
	_, _ = c.ListAuthorities(ctx, "", "", 1)
	_, _ = c.RemoveAllByOwner(ctx, authority.OwnerToken{})
	_, _ = c.Reserve(ctx, authority.ReserveRequest{})
	_, _ = c.Commit(ctx, authority.CommitRequest{})
	_, _ = c.CompleteCreation(ctx, authority.CompleteCreationRequest{})
	_, _ = c.ReadCreationTerminal(ctx, authority.CreationOperation{})
	_, _ = c.Abort(ctx, authority.AbortRequest{})
	_, _ = c.PrepareAggregate(ctx, authority.AggregatePrepareRequest{})
	_, _ = c.CommitAggregate(ctx, authority.Fence{})
	_, _ = c.AbortAggregate(ctx, authority.Fence{})
	_, _ = c.CapacityUsage(ctx, authority.NodeDescriptor{}, 1, authority.ObjectActor, "")
	_ = c.WaitForChange(ctx, "k", "")
	ops := []Operation{OpRead, OpCompareExchange, OpList, OpRemoveAllByOwner, OpReserve, OpCommit, OpCompleteCreation,
		OpReadTerminal, OpAbort, OpPrepareAggregate, OpCommitAggregate, OpAbortAggregate, OpCapacityUsage, OpWaitForChange}
	for _, op := range ops {
		outcome := "ok"
		if op == OpRead {
			outcome = string(authority.KindMissing)
		}
		require.Equal(t, 1.0, testutil.ToFloat64(c.obs.metrics.operations.WithLabelValues(op.String(), outcome)), op.String())
	}
	n, err := testutil.GatherAndCount(reg, "authority_operations_total")
	require.NoError(t, err)
	require.Equal(t, len(ops), n, "one series an operation: no operation counted under another's name")
}
