package observe

// Operation names the contract operation a metric or span is about. The set
// is closed: their names are the label values of the operation label.
type Operation uint8

// The contract operations.
const (
	OpRead Operation = iota
	OpCompareExchange
	OpList
	OpRemoveAllByOwner
	OpReserve
	OpCommit
	OpCompleteCreation
	OpReadTerminal
	OpAbort
	OpPrepareAggregate
	OpCommitAggregate
	OpAbortAggregate
	OpCapacityUsage
	OpWaitForChange
	OpRebindRows
	OpPruneEpochs
	OpRelocationPut
	OpRelocationRead
	OpRelocationDelete
	OpOwnerLeaseAcquire
	numOperations
)

var operationNames = [numOperations]string{
	"read", "compare_exchange", "list", "remove_all_by_owner", "reserve", "commit", "complete_creation",
	"read_creation_terminal", "abort", "prepare_aggregate", "commit_aggregate", "abort_aggregate",
	"capacity_usage", "wait_for_change", "rebind_rows", "prune_capacity_epochs", "relocation_put",
	"relocation_read", "relocation_delete", "owner_lease_acquire",
}

// String returns the operation's label value.
func (op Operation) String() string {
	if op < numOperations {
		return operationNames[op]
	}
	return "unknown"
}

// Compare names the condition of a write that did not hold: the reason a
// write was refused or conflicted, put on the operation's span as the
// attribute authority.failed_compare and counted by
// authority_failed_compares_total.
type Compare string

// The compare kinds.
const (
	// CompareRowVersion: the row changed since the version the caller
	// named (or the row is missing or not in the expected state).
	CompareRowVersion Compare = "row_version"
	// CompareOwnerLease: the owner lease the write depends on is gone.
	CompareOwnerLease Compare = "owner_lease"
	// CompareCapacityEpoch: the node's capacity changed since it was read.
	CompareCapacityEpoch Compare = "capacity_epoch"
	// CompareAggregateRecord: the aggregate record changed.
	CompareAggregateRecord Compare = "aggregate_record"
	// CompareLimit: a capacity limit, generation or size limit refused it.
	CompareLimit Compare = "limit"
	// CompareReservation: the reservation terminal or reserved row differs.
	CompareReservation Compare = "reservation"
)

// outcomeError is the outcome label of an operation that returned an error;
// the error label then names its sentinel.
const outcomeError = "error"
