// Package storeversion names every gated change of the etcd provider's stored
// format and fence rules, in this one file, like CockroachDB's clusterversion.
//
// A namespace has one active version (the key schema.Layout.ActiveVersion;
// absent means Base). Writers write the format, and use the fence rules, of
// the active version, never the newest they know; readers read every format
// of every version from MinSupported up to Latest. The active version moves
// forward only by finalize (etcd.Finalize, `authorityctl upgrade finalize`),
// once every live store of the namespace announces that it supports the
// target. A build whose range does not hold the active version refuses to
// start.
//
// # Introducing a change to a stored value or a fence
//
//  1. Add a constant below, one higher than the newest released one (move
//     NextPretend up: it stays beyond every released version), with a doc
//     comment saying what changes and whether it is a stored format or a
//     fence rule, and its entry in names. Raise latest (latest.go) to it.
//  2. Read both: every decoder accepts the old form and the new one (and
//     strict decoding keeps refusing anything else).
//  3. Write the old: the new form or rule is used only where
//     Store.atLeast(theConstant) holds, that is after finalize.
//  4. Test a namespace at the old version next to one finalized to the new,
//     and a rolling upgrade from the previous release (faults/upgrade_test.go).
//  5. A later release may raise MinSupported past the constant, dropping the
//     old form's writer (never its reader while old values may remain).
package storeversion

import "strconv"

// Version is a store version of a namespace: a set of stored formats and
// fence rules. Versions are ordered; each adds one change to the one before.
type Version int32

const (
	// Base is the format and fence rules of every release before versions
	// were announced: row format 1 with its ownership token, aggregate
	// records format 1, capacity epochs fenced by every capacity change. A
	// namespace without an active-version key is at Base, and a live owner
	// lease that no store announced counts as Base.
	Base Version = 1

	// TokenFollowsOwner (a fence rule): an aggregate commit whose
	// new-owner transition keeps the row's owner ID and lease generation
	// keeps its ownership token. At Base such a commit gives the row a new
	// token, so one owner would hold two tokens and a guard that saw the
	// newer one would refuse the owner's in-flight effects tagged with the
	// older one.
	TokenFollowsOwner Version = 2

	// CompactFormat (a stored format): row metadata and capacity entries
	// in the compact format (schema's compact.go: protobuf behind a marker
	// byte, where format 1 was JSON with field names; docs/design-etcd.md,
	// "The compact format"). Every build from this one reads both formats;
	// a build before it refuses a compact value as ErrCorrupt, which is
	// why the format is written only once the namespace is finalized here,
	// and every Txn that writes it compares the active version (fence).
	CompactFormat Version = 3

	// RowLocks (a fence rule and new stored kinds): every write of an
	// existing row also compares that the row has no row lock (the key
	// schema.Layout.RowLock, absent), which a cross-shard aggregate's
	// commit holds on its participants between its lock and its apply
	// (package provider/sharded/twophase; docs/scale.md, "Aggregates
	// across shards"). A build before it writes rows without that compare,
	// so row locks, cross-shard aggregate records (field "i") and part
	// markers are written only once the namespace is finalized here, and
	// every Txn that writes a row lock compares the active version.
	RowLocks Version = 4

	// FewerKeys (a stored format): fewer keys per row (docs/design-etcd.md,
	// "Fewer keys per row"). A row's capacity entry is its one placement
	// key, under its node lifecycle's capacity range and named by its owner
	// (capacity/<node>/<lifecycle>/o/<owner>/<generation>/<key>), which
	// also serves as the owner index, with a directory key per owner lease
	// generation and node lifecycle (owner-nodes/); a commit writes no
	// reservation terminal (the active row keeps the reservation that
	// committed it until the retention ends, and a delete within it writes
	// the terminal then); a creation completion writes none either, and its
	// creation terminal is compact (protobuf, the envelope without its
	// digest, the operation read from the key). Every build from this one
	// reads both layouts; a build before it refuses a row, placement key or
	// terminal of this version as ErrCorrupt, so they are written only once
	// the namespace is finalized here, fenced on the active version as
	// compact writes are.
	FewerKeys Version = 5

	// RowMoves (a stored format): a row that a resharding copied into
	// another shard (package provider/sharded/reshard) keeps its object
	// generation and its StoreVersion in the row's value (format 1: "cg"
	// and "mv", compact: object_gen and moved_version), since its key's
	// CreateRevision and ModRevision in the new cluster are other numbers.
	// A build before it refuses such a row as ErrCorrupt, so a resharding
	// copies rows only into a namespace at this version or later (a new
	// cluster's namespace starts at Latest).
	RowMoves Version = 6

	// NextPretend is a change that exists only in test builds (build tag
	// authority_next): a row field (schema's rowNext, "nx") and a fence
	// rule (a row write also compares the namespace's active version). It
	// proves the mechanism with a version the released build cannot read.
	NextPretend Version = 7
)

// MinSupported is the oldest active version this build works at.
const MinSupported = Base

// Latest is the newest version this build works at (and announces).
const Latest = latest

// names is every version's constant name, oldest first. String reads it;
// TestNamesAreTheConstants checks each name against the constant beside it
// and that every constant of type Version has its entry.
var names = []struct {
	v    Version
	name string
}{
	{Base, "Base"},
	{TokenFollowsOwner, "TokenFollowsOwner"},
	{CompactFormat, "CompactFormat"},
	{RowLocks, "RowLocks"},
	{FewerKeys, "FewerKeys"},
	{RowMoves, "RowMoves"},
	{NextPretend, "NextPretend"},
}

// Known reports whether v is a version this build can work at.
func Known(v Version) bool { return v >= MinSupported && v <= Latest }

// String returns the version's number and, when this build knows it, its
// name: "2 (TokenFollowsOwner)".
func (v Version) String() string {
	for _, n := range names {
		if n.v == v && v <= Latest {
			return strconv.Itoa(int(v)) + " (" + n.name + ")"
		}
	}
	return strconv.Itoa(int(v))
}
