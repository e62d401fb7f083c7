package shardtest

import (
	"context"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/provider/sharded"
)

// Open opens a sharded store of cfg, closed at t's cleanup; it fails t
// when the store does not open.
func Open(t testing.TB, cfg sharded.Config) *sharded.Store {
	t.Helper()
	s, err := sharded.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("new sharded store: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// LiveMarker is a store whose owners a test marks live or dead (the etcd
// and the sharded store).
type LiveMarker interface {
	// MarkLive makes owner live on node at lifecycle for ttl.
	MarkLive(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken, ttl time.Duration) error
	// MarkDead ends owner's liveness on node at lifecycle.
	MarkDead(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken) error
}

// SetLive returns a conformance.Harness SetLive over s: it marks owners
// live for ttl, or dead, and fails t on an error.
func SetLive(s LiveMarker, ttl time.Duration) func(t testing.TB, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken, live bool) {
	return func(t testing.TB, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken, live bool) {
		t.Helper()
		var err error
		if live {
			err = s.MarkLive(context.Background(), node, lifecycle, owner, ttl)
		} else {
			err = s.MarkDead(context.Background(), node, lifecycle, owner)
		}
		if err != nil {
			t.Fatalf("set live: %v", err)
		}
	}
}

// Harness is a conformance harness over s that marks owners live for ttl,
// with s's relocation store and record retention, on clock (nil: the wall
// clock, which the harness cannot advance). The caller adds what else its
// store offers (capacity policies, expiring scans, identity claims).
func Harness(s *sharded.Store, clock *authority.ManualClock, ttl time.Duration) *conformance.Harness {
	h := &conformance.Harness{
		Store:           s,
		SetLive:         SetLive(s, ttl),
		Now:             time.Now,
		Relocation:      s.Relocation(),
		RecordRetention: s.RecordRetention(),
	}
	if clock != nil {
		h.AdvanceClock = func(_ testing.TB, d time.Duration) { clock.Advance(d) }
		h.Now = clock.Now
	}
	return h
}
