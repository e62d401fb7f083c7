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
//  1. Add a constant below, one higher than Latest's, with its description
//     and its entry in changes. Raise latest (latest.go) to it.
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

	// NextPretend is a change that exists only in test builds (build tag
	// authority_next): a row field (schema's rowNext, "nx") and a fence
	// rule (a row write also compares the namespace's active version). It
	// proves the mechanism with a version the released build cannot read.
	NextPretend Version = 3
)

// MinSupported is the oldest active version this build works at.
const MinSupported = Base

// Latest is the newest version this build works at (and announces).
const Latest = latest

// Change describes one gated change.
type Change struct {
	// Version is the version that introduces the change.
	Version Version
	// Name is the constant's name.
	Name string
	// Kind is "format" (a stored value changes) or "fence" (a write's
	// conditions or a token rule change).
	Kind string
	// Description says what changes once the namespace is at Version.
	Description string
}

var changes = []Change{
	{Base, "Base", "format", "row format 1 with ownership tokens, aggregate records format 1, capacity epochs"},
	{TokenFollowsOwner, "TokenFollowsOwner", "fence", "an aggregate commit that keeps the row's owner and lease generation keeps its ownership token"},
	{NextPretend, "NextPretend", "format", "test builds only: a row field and a fence rule no released build knows"},
}

// Changes returns the changes this build knows, oldest first, up to Latest.
func Changes() []Change {
	var out []Change
	for _, c := range changes {
		if c.Version <= Latest {
			out = append(out, c)
		}
	}
	return out
}

// Known reports whether v is a version this build can work at.
func Known(v Version) bool { return v >= MinSupported && v <= Latest }

// String returns the version's number and, when this build knows it, its
// name: "2 (TokenFollowsOwner)".
func (v Version) String() string {
	for _, c := range changes {
		if c.Version == v && v <= Latest {
			return strconv.Itoa(int(v)) + " (" + c.Name + ")"
		}
	}
	return strconv.Itoa(int(v))
}
