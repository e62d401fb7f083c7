package observe

// Operation names the contract operation a metric or span is about. The set
// is closed: they are the label values of the operation label.
type Operation string

// The contract operations.
const (
	OpRead              Operation = "read"
	OpCompareExchange   Operation = "compare_exchange"
	OpList              Operation = "list"
	OpRemoveAllByOwner  Operation = "remove_all_by_owner"
	OpReserve           Operation = "reserve"
	OpCommit            Operation = "commit"
	OpCompleteCreation  Operation = "complete_creation"
	OpReadTerminal      Operation = "read_creation_terminal"
	OpAbort             Operation = "abort"
	OpPrepareAggregate  Operation = "prepare_aggregate"
	OpCommitAggregate   Operation = "commit_aggregate"
	OpAbortAggregate    Operation = "abort_aggregate"
	OpCapacityUsage     Operation = "capacity_usage"
	OpWaitForChange     Operation = "wait_for_change"
	OpRebindRows        Operation = "rebind_rows"
	OpPruneEpochs       Operation = "prune_capacity_epochs"
	OpRelocationPut     Operation = "relocation_put"
	OpRelocationRead    Operation = "relocation_read"
	OpRelocationDelete  Operation = "relocation_delete"
	OpOwnerLeaseAcquire Operation = "owner_lease_acquire"
)

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
