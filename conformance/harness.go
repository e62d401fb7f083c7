// Package conformance is the executable statement of the authority store
// contract. It is a set of exported RunTestX functions over a Factory, in the
// style of Kubernetes' apiserver/pkg/storage/testing: every provider's tests
// call RunAll (or the RunTestX functions they support) with a factory for a
// fresh store, and backend-specific abilities are passed in as callbacks; a
// test that needs an ability the provider lacks skips with the reason.
package conformance

import (
	"strings"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
)

// Harness is one fresh, empty store plus the controls tests need.
// Nil controls mean the provider cannot offer them; tests needing them skip.
type Harness struct {
	// Store is the store under test. It starts empty.
	Store authority.Store

	// SetLive makes owner live (true) or not live (false) on node at the
	// given lifecycle generation: the store's isTargetLive answers
	// accordingly from then on. Required.
	SetLive func(t testing.TB, node authority.NodeDescriptor, lifecycleGeneration int64, owner authority.OwnerToken, live bool)

	// SetCapacityPolicy installs the placement capacity policy (nil: every
	// placement fits). Nil when the provider cannot change it.
	SetCapacityPolicy func(t testing.TB, policy authority.CapacityPolicy)

	// ClaimIdentity marks key as claimed (identityClaimed answers true).
	// Nil when unsupported.
	ClaimIdentity func(t testing.TB, key authority.Key)

	// AdvanceClock moves the clock the store reads by d: forward, or back
	// for a negative d (an NTP step). Nil when the store runs on the wall
	// clock.
	AdvanceClock func(t testing.TB, d time.Duration)

	// Now is the store's clock. Required.
	Now func() time.Time

	// ExpireScans makes every cursor handed out so far expire (for etcd: a
	// compaction at the current revision). Nil when unsupported.
	ExpireScans func(t testing.TB)

	// RecordRetention is how long the store keeps reservation terminals and
	// committed or aborted aggregate records (the window in which a retried
	// commit or abort is answered already*). Zero when unknown: the
	// retention tests skip.
	RecordRetention time.Duration

	// Relocation is the store's relocation blob store, or nil.
	Relocation authority.RelocationStore

	// LeaveGenerations moves the store's counter c on so that exactly left
	// more values remain before authority.MaxGeneration (left 0: the next
	// write that needs one reports generationExhausted). It never moves a
	// counter back. Nil when the provider cannot (etcd revisions cannot be
	// set): the GenerationExhausted tests skip.
	LeaveGenerations func(t testing.TB, c GenerationCounter, left int64)

	// Skip names subtests the provider deliberately does not pass, each
	// with its reason (a documented deviation): a subtest whose name ends
	// in "/" + a key (for example "AggregateCommit/StalePreservedOwnerNotLive")
	// skips with the reason. Nil: none.
	Skip map[string]string
}

// skipped returns the reason h skips the subtest named name, if any.
func (h *Harness) skipped(name string) (string, bool) {
	for k, reason := range h.Skip {
		if strings.HasSuffix(name, "/"+k) {
			return reason, true
		}
	}
	return "", false
}

// GenerationCounter names one of the store's three counters (store
// version, object generation, owner generation).
type GenerationCounter int

// The counters LeaveGenerations moves.
const (
	// StoreVersions counts row versions: every row write takes one.
	StoreVersions GenerationCounter = iota
	// ObjectGenerations counts object generations: every reserve takes one.
	ObjectGenerations
	// OwnerGenerations counts owner generations: every reserve and every
	// newOwner participant of an aggregate commit takes one.
	OwnerGenerations
)

// String returns the counter's name.
func (c GenerationCounter) String() string {
	switch c {
	case StoreVersions:
		return "storeVersion"
	case ObjectGenerations:
		return "objectGeneration"
	case OwnerGenerations:
		return "ownerGeneration"
	}
	return "unknown counter"
}

// Factory returns a fresh harness. It registers its own cleanup with t.
type Factory func(t *testing.T) *Harness
