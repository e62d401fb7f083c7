package faults_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// escrowReplay follows one shard's capacity entries and escrow keys of one
// node lifecycle through that shard's history and checks escrow's
// invariants after every revision (provider/sharded/escrow's fencing
// argument): the usage in the shard is within its budget slice, the
// ledger (in the node's home shard) grants no more than the limits, and
// the cumulative counts of the slice and the ledger never go down.
type escrowReplay struct {
	ns     string
	tgt    authority.CreationTarget
	home   bool
	limits capLimits
	held   map[string]schema.Budget // capacity entry key → what it holds
	slice  schema.BudgetSlice
	ledger schema.BudgetLedger
	err    error // a count that went down, found by apply
}

func newEscrowReplay(ns string, tgt authority.CreationTarget, home bool, limits capLimits) *escrowReplay {
	return &escrowReplay{ns: ns, tgt: tgt, home: home, limits: limits, held: map[string]schema.Budget{}}
}

// apply takes one event of the shard's history.
func (r *escrowReplay) apply(kv *mvccpb.KeyValue, put bool) error {
	key := string(kv.Key)
	if !put {
		delete(r.held, key)
		return nil
	}
	e, err := schema.DecodeEntry(r.ns, kv)
	if err != nil {
		return err
	}
	if e.Node != r.tgt.Descriptor() || e.Lifecycle != r.tgt.NodeLifecycleGeneration {
		return nil
	}
	switch {
	case e.Kind == schema.EntryCapacity:
		r.held[key] = schema.BudgetOf(e.Capacity.Vector)
	case e.BudgetSlice != nil:
		s := *e.BudgetSlice
		if !s.Received.Covers(r.slice.Received) || !s.Returned.Covers(r.slice.Returned) {
			r.err = errors.Join(r.err, fmt.Errorf("the slice's counts went down: %+v after %+v", s, r.slice))
		}
		r.slice = s
	case e.BudgetLedger != nil:
		l := *e.BudgetLedger
		for i, old := range r.ledger.Shards {
			if now := l.Shards[i]; !now.Given.Covers(old.Given) || !now.Taken.Covers(old.Taken) {
				r.err = errors.Join(r.err, fmt.Errorf("shard %d's ledger line went down: %+v after %+v", i, now, old))
			}
		}
		r.ledger = l
	}
	return nil
}

// check checks the invariants at the end of a revision.
func (r *escrowReplay) check() error {
	err := r.err
	r.err = nil
	usage := schema.Budget{}
	for _, b := range r.held {
		usage = usage.Plus(b)
	}
	if !r.slice.Size().Covers(usage) {
		err = errors.Join(err, fmt.Errorf("usage %v over the slice %v", usage, r.slice.Size()))
	}
	if r.home {
		g := r.ledger.Granted()
		actors := g[schema.BudgetCounter{Kind: authority.ObjectActor}]
		spots := g[schema.BudgetCounter{Kind: authority.CounterSpots}]
		if actors > r.limits.actors || spots > r.limits.spots {
			err = errors.Join(err, fmt.Errorf("the ledger grants %d actors and %d Spots, over the limits %d and %d", actors, spots, r.limits.actors, r.limits.spots))
		}
	}
	return err
}

// replayRange replays every change of the keys in [from, end) since
// revision rev (etcd's history; the test clusters never compact), handing
// each event to apply and calling atRevision once every event of a
// revision was applied. It puts end (a marker no store reads) to know
// where the history it needs ends.
func replayRange(t *testing.T, cli *clientv3.Client, from, end string, rev int64, apply func(kv *mvccpb.KeyValue, put bool) error, atRevision func(rev int64)) {
	t.Helper()
	ctx := settle(t)
	if _, err := cli.Put(ctx, end, ""); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	last := int64(0)
	for wr := range cli.Watch(wctx, from, clientv3.WithRange(end+"\x00"), clientv3.WithRev(rev+1)) {
		if err := wr.Err(); err != nil {
			t.Fatalf("replaying %s…: %v", from, err)
		}
		for _, ev := range wr.Events {
			if r := ev.Kv.ModRevision; r != last {
				if last != 0 {
					atRevision(last)
				}
				last = r
			}
			if string(ev.Kv.Key) == end {
				return
			}
			if err := apply(ev.Kv, ev.Type == clientv3.EventTypePut); err != nil {
				t.Fatalf("replaying %s: %v", ev.Kv.Key, err)
			}
		}
	}
	t.Fatal("the replay ended before its end marker")
}
