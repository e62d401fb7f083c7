// Package memory is the in-memory authority store: a port of the framework's
// TypeScript ZLinkInMemoryAuthorityStore implementing authority.Store, with
// the same checks in the same order and the same outcomes.
//
// Differences from the TypeScript reference store, each deliberate
// (docs/deviations.md, M1–M11):
//
//   - It is safe for concurrent use. One mutex guards the whole state; every
//     operation is atomic with respect to every other. The hooks (the
//     liveness oracle, the capacity policy, the identity claims) are called
//     with that mutex held, as a single-threaded store calls them inside
//     one turn: they must be quick and must not call back into the Store.
//   - Rows are kept in an ordered index (a copy-on-write B-tree), so a
//     listing page costs O(log n + limit). A listing reads a
//     pinned copy of the index taken when it started, so later writes never
//     tear it; pinned copies are dropped after Config.ScanRetention, beyond
//     Config.MaxPinnedScans, or by ExpireScans, and a cursor whose copy was
//     dropped answers KindScanExpired. A write rewrites a row in place when
//     no pinned copy can see it and no listing is copying rows, and stores a
//     new row value otherwise. Results are always the caller's own copies.
//   - Reservation terminals and committed or aborted aggregate records are
//     swept Config.ReservationRetention after they were written, creation terminals at
//     their expiry. Sweeping is lazy and amortized on writes; there is no
//     background goroutine and nothing to close.
//
// Optional capabilities: Store implements authority.ChangeWaiter, and
// NewRelocationStore returns an authority.RelocationStore.
package memory
