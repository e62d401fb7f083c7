package observe

import (
	"context"
	"fmt"
	"reflect"

	authority "github.com/zlink-systems/authority"
)

// Work is a provider's contract operations, unobserved: each field is the
// method that does the work (a provider fills it with its method values).
type Work struct {
	ReadAuthority            func(ctx context.Context, key authority.Key) (authority.ReadResult, error)
	CompareExchangeAuthority func(ctx context.Context, key authority.Key, expected authority.StoreVersion, m authority.Mutation) (authority.CompareExchangeResult, error)
	ListAuthorities          func(ctx context.Context, prefix string, cursor authority.ScanCursor, limit int) (authority.ScanResult, error)
	RemoveAllByOwner         func(ctx context.Context, owner authority.OwnerToken) (int64, error)
	Reserve                  func(ctx context.Context, req authority.ReserveRequest) (authority.ReserveResult, error)
	Commit                   func(ctx context.Context, req authority.CommitRequest) (authority.CommitResult, error)
	CompleteCreation         func(ctx context.Context, req authority.CompleteCreationRequest) (authority.CompleteCreationResult, error)
	ReadCreationTerminal     func(ctx context.Context, o authority.CreationOperation) (authority.TerminalReadResult, error)
	Abort                    func(ctx context.Context, req authority.AbortRequest) (authority.AbortResult, error)
	PrepareAggregate         func(ctx context.Context, req authority.AggregatePrepareRequest) (authority.PrepareAggregateResult, error)
	CommitAggregate          func(ctx context.Context, fence authority.Fence) (authority.CommitAggregateResult, error)
	AbortAggregate           func(ctx context.Context, fence authority.Fence) (authority.AbortAggregateResult, error)
	CapacityUsage            func(ctx context.Context, node authority.NodeDescriptor, lifecycleGeneration int64, objectKind authority.ObjectKind, stableType string) (authority.CapacityUsage, error)
	WaitForChange            func(ctx context.Context, key authority.Key, seen authority.StoreVersion) error
}

// Contract is the provider contract (authority.Store and
// authority.ChangeWaiter) over a provider's Work, each operation recorded by
// the observer (metrics, span, outcome). A provider's Store embeds it, so
// both providers record the same operations the same way.
type Contract struct {
	obs  *Observer
	work Work
}

// NewContract returns the contract over work, recorded by obs (nil records
// nothing). It panics when a field of work is nil: a provider that does not
// fill every operation is a programming error, found by any test that opens
// a store.
func NewContract(obs *Observer, work Work) Contract {
	w := reflect.ValueOf(work)
	for i := range w.NumField() {
		if w.Field(i).IsNil() {
			panic(fmt.Sprintf("observe: Work.%s is nil", w.Type().Field(i).Name))
		}
	}
	return Contract{obs: obs, work: work}
}

var (
	_ authority.Store        = Contract{}
	_ authority.ChangeWaiter = Contract{}
)

// ReadAuthority reads the row at key.
func (c Contract) ReadAuthority(ctx context.Context, key authority.Key) (res authority.ReadResult, err error) {
	ctx, op := c.obs.Start(ctx, OpRead)
	res, err = c.work.ReadAuthority(ctx, key)
	op.End(res.Kind, err)
	return res, err
}

// CompareExchangeAuthority applies m to the active row at key when its
// version is expected.
func (c Contract) CompareExchangeAuthority(ctx context.Context, key authority.Key, expected authority.StoreVersion, m authority.Mutation) (res authority.CompareExchangeResult, err error) {
	ctx, op := c.obs.Start(ctx, OpCompareExchange)
	res, err = c.work.CompareExchangeAuthority(ctx, key, expected, m)
	op.End(res.Kind, err)
	return res, err
}

// ListAuthorities returns one page of rows under prefix.
func (c Contract) ListAuthorities(ctx context.Context, prefix string, cursor authority.ScanCursor, limit int) (res authority.ScanResult, err error) {
	ctx, op := c.obs.Start(ctx, OpList)
	res, err = c.work.ListAuthorities(ctx, prefix, cursor, limit)
	op.End(res.Kind, err)
	return res, err
}

// RemoveAllByOwner deletes every row of owner and returns how many.
func (c Contract) RemoveAllByOwner(ctx context.Context, owner authority.OwnerToken) (n int64, err error) {
	ctx, op := c.obs.Start(ctx, OpRemoveAllByOwner)
	n, err = c.work.RemoveAllByOwner(ctx, owner)
	op.End("", err)
	return n, err
}

// Reserve reserves a row for a creation.
func (c Contract) Reserve(ctx context.Context, req authority.ReserveRequest) (res authority.ReserveResult, err error) {
	ctx, op := c.obs.Start(ctx, OpReserve)
	res, err = c.work.Reserve(ctx, req)
	op.End(res.Kind, err)
	return res, err
}

// Commit activates a reserved row.
func (c Contract) Commit(ctx context.Context, req authority.CommitRequest) (res authority.CommitResult, err error) {
	ctx, op := c.obs.Start(ctx, OpCommit)
	res, err = c.work.Commit(ctx, req)
	op.End(res.Kind, err)
	return res, err
}

// CompleteCreation commits or fails a reservation and records the creation
// terminal.
func (c Contract) CompleteCreation(ctx context.Context, req authority.CompleteCreationRequest) (res authority.CompleteCreationResult, err error) {
	ctx, op := c.obs.Start(ctx, OpCompleteCreation)
	res, err = c.work.CompleteCreation(ctx, req)
	op.End(res.Kind, err)
	return res, err
}

// ReadCreationTerminal reads a creation operation's terminal.
func (c Contract) ReadCreationTerminal(ctx context.Context, o authority.CreationOperation) (res authority.TerminalReadResult, err error) {
	ctx, op := c.obs.Start(ctx, OpReadTerminal)
	res, err = c.work.ReadCreationTerminal(ctx, o)
	op.End(res.Kind, err)
	return res, err
}

// Abort releases a reservation.
func (c Contract) Abort(ctx context.Context, req authority.AbortRequest) (res authority.AbortResult, err error) {
	ctx, op := c.obs.Start(ctx, OpAbort)
	res, err = c.work.Abort(ctx, req)
	op.End(res.Kind, err)
	return res, err
}

// PrepareAggregate prepares an aggregate move.
func (c Contract) PrepareAggregate(ctx context.Context, req authority.AggregatePrepareRequest) (res authority.PrepareAggregateResult, err error) {
	ctx, op := c.obs.Start(ctx, OpPrepareAggregate)
	res, err = c.work.PrepareAggregate(ctx, req)
	op.End(res.Kind, err)
	return res, err
}

// CommitAggregate commits a prepared aggregate.
func (c Contract) CommitAggregate(ctx context.Context, fence authority.Fence) (res authority.CommitAggregateResult, err error) {
	ctx, op := c.obs.Start(ctx, OpCommitAggregate)
	res, err = c.work.CommitAggregate(ctx, fence)
	op.End(res.Kind, err)
	return res, err
}

// AbortAggregate aborts a prepared aggregate.
func (c Contract) AbortAggregate(ctx context.Context, fence authority.Fence) (res authority.AbortAggregateResult, err error) {
	ctx, op := c.obs.Start(ctx, OpAbortAggregate)
	res, err = c.work.AbortAggregate(ctx, fence)
	op.End(res.Kind, err)
	return res, err
}

// CapacityUsage reports a node lifecycle's used capacity.
func (c Contract) CapacityUsage(ctx context.Context, node authority.NodeDescriptor, lifecycleGeneration int64, objectKind authority.ObjectKind, stableType string) (res authority.CapacityUsage, err error) {
	ctx, op := c.obs.Start(ctx, OpCapacityUsage)
	res, err = c.work.CapacityUsage(ctx, node, lifecycleGeneration, objectKind, stableType)
	op.End("", err)
	return res, err
}

// WaitForChange waits until the row at key is no longer at seen.
func (c Contract) WaitForChange(ctx context.Context, key authority.Key, seen authority.StoreVersion) (err error) {
	ctx, op := c.obs.Start(ctx, OpWaitForChange)
	err = c.work.WaitForChange(ctx, key, seen)
	op.End("", err)
	return err
}
