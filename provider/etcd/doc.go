// Package etcd is the etcd provider of the authority store: every operation of
// the authority.Store contract as etcd Txn compare-and-swaps on
// go.etcd.io/etcd/client/v3.
//
// # Key layout
//
// Every key lives under the store's namespace ns (default
// "/zlink/authority/v1/", always ending in "/"); nothing outside it is read or
// written. Segments written <esc x> are url.PathEscape'd, so they never
// contain "/". Package schema builds and parses these keys and encodes and
// decodes their values; nothing else knows their bytes.
//
//	ns/rows/<authority key>                         row: metadata + payload
//	ns/owners/<esc owner>/<lease gen>/<esc mesh>/<esc rid>/<lifecycle>
//	                                                owner liveness key, attached to the owner's lease
//	ns/owner-gens/<esc owner>                       last lease generation handed to the owner
//	ns/owner-rows/<esc owner>/<lease gen>/<authority key>
//	                                                owner index (empty value) of a row placed before
//	                                                store version FewerKeys
//	ns/owner-nodes/<esc owner>/<lease gen>/<esc mesh>/<esc rid>/<lifecycle>
//	                                                owner directory (empty value, FewerKeys): the owner
//	                                                may hold placement keys on that node lifecycle
//	ns/capacity/<esc mesh>/<esc rid>/<lifecycle>/row/<authority key>
//	ns/capacity/<esc mesh>/<esc rid>/<lifecycle>/agg/<esc id>/<gen>
//	ns/capacity/<esc mesh>/<esc rid>/<lifecycle>/o/<esc owner>/<lease gen>/<authority key>
//	                                                capacity index: one entry per row or aggregate,
//	                                                value = its state (reserved or active) and the
//	                                                capacity vector it holds; a row placed from
//	                                                FewerKeys on has the o/ one, its placement key,
//	                                                which is also its owner index
//	ns/capacity-epochs/<esc mesh>/<esc rid>/<lifecycle>
//	                                                capacity epoch (empty value): put by every Txn
//	                                                that changes a capacity entry of the node
//	ns/reservations/<esc reservation ID>            reservation terminal (committed, rejected,
//	                                                failed, aborted), on a bucketed lease
//	ns/terminals/<operation key>                    creation terminal, on a bucketed lease
//	ns/aggregates/<esc aggregate ID>/<generation>   aggregate record (prepared, committed, aborted)
//	ns/row-locks/<authority key>                    a cross-shard aggregate's lock on a row (its fence, incarnation,
//	                                                commit attempt and base); every write of an existing row compares
//	                                                it absent (storeversion.RowLocks)
//	ns/aggregate-parts/<esc aggregate ID>/<generation>  a shard's part of a cross-shard aggregate applied (its
//	                                                incarnation and newOwner tokens), on a bucketed lease
//	ns/blobs/<uuid>                                 relocation blob, on a bucketed lease
//	ns/store-version/active                         the namespace's active store version (absent:
//	                                                storeversion.Base); Store.Finalize raises it
//	ns/store-version/announcements/<lease ID>       a running store's announcement (its build and the
//	                                                versions it works at), one per etcd lease it holds
//	                                                (its own and each owner lease's, 16 hex digits),
//	                                                attached to that lease
//	ns/capacity-escrow/slices/<esc mesh>/<esc rid>/<lifecycle>
//	                                                escrow mode only (Config.CapacityEscrow): the node
//	                                                lifecycle's budget slice in this shard
//	ns/capacity-escrow/ledgers/<esc mesh>/<esc rid>/<lifecycle>
//	                                                escrow mode only, in the node's home shard: what its
//	                                                ledger gave each shard and took back
//	ns/shard-map/current                            the shard map of a store over several clusters
//	                                                (provider/sharded): the same in every shard's
//	                                                namespace; absent in a single cluster's
//
// TestPackageDocKeyLayout (package schema) keeps this list equal to the keys
// schema builds.
//
// # Row feed
//
// Store is an authority.RowFeed: WatchRows lists the rows under a prefix
// and follows their changes (one etcd watch), FeedRevision reads the
// store's revision. ExampleStore_WatchRows shows a consumer that resumes
// after a restart; the repository's examples/rowfeed runs one through a
// compaction (authority.ErrFeedCompacted: it relists) and reads through a
// view (package view) on etcd.
//
// # Versions and generations
//
// A row's StoreVersion is its key's ModRevision in decimal (absence is
// ModRevision 0). Its object generation is the key's CreateRevision. Its
// owner generation is the revision of the write that gave it its owner
// (reserve, or an aggregate's newOwner commit): that write stores a sentinel
// meaning "my own ModRevision", and the next write of the row stores the
// resolved number. Its ownership token (Snapshot.OwnershipToken) is kept the
// same way; it changes exactly when the owner ID or the lease generation
// changes (so also on a rebind to a new lease, and not on a newOwner commit
// to the row's current owner). No counter key is shared by
// all writes.
//
// # Fencing
//
// Every operation is one Txn with all of its conditions in the outer If: the
// row's ModRevision, the liveness key of the owner that must be live
// (CreateRevision > 0, so a zombie owner whose lease expired cannot write),
// the aggregate record's ModRevision and, under a capacity policy, that no
// capacity entry of the node changed since the usage the decision used:
// ModRevision(capacity epoch) = the ModRevision that read saw, one key
// however many entries the node holds (every Txn that puts or deletes a
// capacity entry also puts its node's epoch; PruneCapacityEpochs deletes
// the epochs of nodes that hold no entry). The usage itself is summed from the node's capacity
// range once, then kept current by a watch on that range (usagewatch.go).
// Conflict answers come from the Txn's Else gets. Rows are not attached to owner leases: RemoveAllByOwner
// deletes them explicitly through the owner index, in batches that fit the
// Txn limit.
//
// A bounded, version-addressed cache of decoded rows, keyed by (key,
// ModRevision) — a pair that names one immutable row state — lets CAS put,
// commit and abort build their Txn without reading first: one round trip.
//
// # Expiry
//
// Reservation terminals, creation terminals and relocation blobs expire
// through a few shared leases bucketed by expiry (one lease per minute of
// expiry), and every read also checks the stored expiry against the store's
// Clock, so nothing is served after it expired.
package etcd
