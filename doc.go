// Package authority states the provider contract of the virtual-actor
// framework's authority store: the durable record of which cluster node owns
// every Actor and Spot, how objects are created on a node (reserve → commit,
// or completeCreation for Actors), and how groups of rows move between owners
// atomically (prepare → commit/abort of an aggregate).
//
// Providers live in provider/memory and provider/etcd; the conformance suite
// in conformance/ is the executable statement of the semantics written down
// here. The behaviour was specified by a TypeScript reference implementation;
// docs/glossary.md maps its names to these, and docs/deviations.md lists every
// deliberate difference.
//
// # The API
//
// [Store] is what callers use: [AuthorityStore] (read, compare-and-swap,
// remove by owner, list), [ObjectCreationStore] (reserve, commit, abort,
// completeCreation, creation terminals), [AggregateStore] (prepare, commit and
// abort of aggregates) and [CapacityReader]. The optional [ChangeWaiter],
// [RelocationStore] and [RowFeed] (an ordered change feed of rows, each
// [Feed] resumable after a revision; package view builds a local read view
// on it) are offered by providers that can; a store of several revision
// sequences (provider/sharded) is also a [FeedPositioner], whose feeds resume
// after a [FeedPosition]. A provider is given its policy
// through the hooks [LivenessOracle], [CapacityPolicy] and [IdentityClaims],
// and its time through [Clock].
//
// Outcomes that are part of the protocol (a conflict, a stale commit, an
// exhausted capacity, ...) are not errors: every operation returns a result
// whose [ResultKind] names the outcome. Errors are reserved for invalid input
// ([ErrInvalidArgument]: nothing was written), cancelled contexts and provider
// failures ([ErrUnavailable], [ErrOutcomeUnknown], ...).
//
// # Provider toolkit
//
// Everything both providers must check or compute the same way is
// implemented once here; callers of a Store need none of it.
//
//   - Input validation, run before a provider touches any state:
//     [ValidateReserve], [ValidateCommit], [ValidateAbort],
//     [ValidateCompleteCreation], [ValidateCompareExchange],
//     [ValidateAggregatePrepare], [ValidateFence], [ValidateOwner],
//     [ValidateKey], [ValidatePayload], [ValidateMutation],
//     [ValidateScanLimit], [ValidateScanPrefix], [ValidateCapacityVector],
//     [ValidateCreationOperation], [ValidateTerminalExpiry],
//     [ValidateBlobPut], [ValidateFeedRequest],
//     [ValidatePositionedFeedRequest] and [RequireText].
//   - Errors: [Invalid] and [Wrap] build the typed errors providers return.
//   - Listing cursors: [ScanPosition], [EncodeScanCursor], [DecodeScanCursor],
//     [ParseScanCursor].
//   - Capacity accounting: [CapacityEntries], [UsageCounter],
//     [UsageCounters], [UsageVector], [AddCapacity].
package authority
