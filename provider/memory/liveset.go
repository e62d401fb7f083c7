package memory

import (
	"sync"

	authority "github.com/zlink-systems/authority"
)

// LiveSet is a concurrency-safe set of live (node, lifecycle generation,
// owner) targets: an authority.LivenessOracle that tests and single-process
// deployments drive by hand. The zero value is an empty set.
type LiveSet struct {
	mu   sync.RWMutex
	live map[liveTarget]struct{}
}

type liveTarget struct {
	node                authority.NodeDescriptor
	lifecycleGeneration int64
	owner               authority.OwnerToken
}

var _ authority.LivenessOracle = (*LiveSet)(nil)

// NewLiveSet returns an empty set.
func NewLiveSet() *LiveSet { return &LiveSet{} }

// Set makes owner live (live true) or not live on node at lifecycleGeneration.
func (l *LiveSet) Set(node authority.NodeDescriptor, lifecycleGeneration int64, owner authority.OwnerToken, live bool) {
	t := liveTarget{node: node, lifecycleGeneration: lifecycleGeneration, owner: owner}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !live {
		delete(l.live, t)
		return
	}
	if l.live == nil {
		l.live = make(map[liveTarget]struct{})
	}
	l.live[t] = struct{}{}
}

// IsTargetLive reports whether owner is live on node at lifecycleGeneration.
func (l *LiveSet) IsTargetLive(node authority.NodeDescriptor, lifecycleGeneration int64, owner authority.OwnerToken) bool {
	l.mu.RLock()
	_, ok := l.live[liveTarget{node: node, lifecycleGeneration: lifecycleGeneration, owner: owner}]
	l.mu.RUnlock()
	return ok
}
