// Package authority states the provider contract of the virtual-actor
// framework's authority store: the durable record of which cluster node owns
// every Actor and Spot, how objects are created on a node (reserve → commit,
// or completeCreation for Actors), and how groups of rows move between owners
// atomically (prepare → commit/abort of an aggregate).
//
// The contract is a port of the framework's TypeScript in-memory store
// (ZLinkInMemoryAuthorityStore). Providers live in provider/memory and
// provider/etcd; the conformance suite in conformance/ is the executable
// statement of the semantics written down here.
//
// Everything both providers must check about their input is implemented once
// in this package (the Validate* functions). Errors caused by bad input wrap
// ErrInvalidArgument, carry the seed's message, and a provider returns them
// before it writes anything.
//
// Outcomes that are part of the protocol (a conflict, a stale commit, an
// exhausted capacity, ...) are not errors: every operation returns a result
// whose Kind names the outcome with the seed's vocabulary. Errors are reserved
// for invalid input, cancelled contexts and provider failures (ErrUnavailable,
// ErrOutcomeUnknown, ...).
package authority
