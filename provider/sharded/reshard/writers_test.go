package reshard_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/sharded"
	"github.com/zlink-systems/authority/provider/sharded/reshard"
)

// fleet is writers, each with a sharded store of its own (a node), that
// create and rewrite their own rows while the map grows, and the model of
// every write acknowledged.
type fleet struct {
	t      testing.TB
	stores []*sharded.Store
	leases []*sharded.OwnerLease

	mu   sync.Mutex
	rows map[authority.Key]string // the payload last acknowledged

	acked, refused atomic.Int64
	maxRefused     atomic.Int64 // ns a write waited while refused
	failed         chan error
	stop           chan struct{}
	wg             sync.WaitGroup
}

// newFleet opens writers stores over the map of cs[:n] (the rest spares),
// each with an owner lease on its own node.
func newFleet(t testing.TB, cs []etcdstore.Config, n, writers int) *fleet {
	t.Helper()
	f := &fleet{t: t, rows: map[authority.Key]string{}, failed: make(chan error, 16), stop: make(chan struct{})}
	for w := range writers {
		s := openStore(t, cs, n, int64(n), nil)
		l, err := s.Registry().Acquire(context.Background(), node(w), 1, fmt.Sprintf("owner-%d", w), 10*time.Second)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		f.stores, f.leases = append(f.stores, s), append(f.leases, l)
	}
	return f
}

func node(w int) authority.NodeDescriptor {
	return authority.NodeDescriptor{MeshName: "mesh", RID: fmt.Sprintf("node-%d", w)}
}

// fill creates rows rows per writer before the writers start.
func (f *fleet) fill(rows int) {
	var wg sync.WaitGroup
	for w := range f.stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rows {
				if err := f.create(w, fmt.Sprintf("w%d-fill-%d", w, i)); err != nil {
					f.fail(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	f.check()
}

// start runs every writer until halt.
func (f *fleet) start() {
	for w := range f.stores {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.write(w)
		}()
	}
}

// halt stops the writers and fails the test on a writer's failure.
func (f *fleet) halt() {
	close(f.stop)
	f.wg.Wait()
	f.check()
}

func (f *fleet) check() {
	f.t.Helper()
	select {
	case err := <-f.failed:
		f.t.Fatal(err)
	default:
	}
}

func (f *fleet) fail(err error) {
	select {
	case f.failed <- err:
	default:
	}
}

// write is writer w's loop: create a row, or rewrite one of its rows with
// the version it last saw, then read it back through another writer's
// store (which may route by another map state), until halt.
func (f *fleet) write(w int) {
	var mine []authority.Key
	for seq := 0; ; seq++ {
		select {
		case <-f.stop:
			return
		default:
		}
		var err error
		if len(mine) < 8 || seq%3 == 0 {
			id := fmt.Sprintf("w%d-%d", w, seq)
			if err = f.create(w, id); err == nil {
				key, _ := authority.EncodeKey(authority.ObjectUserSpot, id)
				mine = append(mine, key)
			}
		} else {
			err = f.rewrite(w, mine[rand.IntN(len(mine))], fmt.Sprintf("w%d-%d", w, seq))
		}
		if err != nil {
			f.fail(err)
			return
		}
	}
}

// retried runs op until it is not refused for a move (ErrMoving), and
// records how long it was refused.
func (f *fleet) retried(op func() error) error {
	var first time.Time
	for {
		err := op()
		if !errors.Is(err, sharded.ErrMoving) {
			if !first.IsZero() && err == nil {
				waited := int64(time.Since(first))
				for old := f.maxRefused.Load(); waited > old && !f.maxRefused.CompareAndSwap(old, waited); old = f.maxRefused.Load() {
				}
			}
			return err
		}
		if first.IsZero() {
			first = time.Now()
		}
		f.refused.Add(1)
		time.Sleep(5 * time.Millisecond)
	}
}

// create reserves and commits user spot id through writer w's store.
func (f *fleet) create(w int, id string) error {
	s, ctx := f.stores[w], context.Background()
	req := reserveRequest(id, conformance.Target(node(w), 1, f.leases[w].Token()))
	var res authority.ReserveResult
	if err := f.retried(func() (err error) {
		res, err = s.Reserve(ctx, req)
		return err
	}); err != nil {
		return fmt.Errorf("reserve %s: %w", id, err)
	}
	if res.Kind != authority.KindReserved {
		return fmt.Errorf("reserve %s: %s", id, res.Kind)
	}
	payload := "created " + id
	commit := authority.CommitRequest{Key: req.Key, ReservationID: res.ReservationID, ExpectedStoreVersion: res.Creating.StoreVersion,
		Target: req.Target, ReadyPayload: []byte(payload)}
	var done authority.CommitResult
	if err := f.retried(func() (err error) {
		done, err = s.Commit(ctx, commit)
		return err
	}); err != nil {
		return fmt.Errorf("commit %s: %w", id, err)
	}
	if done.Kind != authority.KindCommitted && done.Kind != authority.KindAlreadyCommitted {
		return fmt.Errorf("commit %s: %s", id, done.Kind)
	}
	key, _ := req.Key.Encode()
	return f.acknowledged(w, key, payload)
}

// rewrite puts payload into key (writer w's row) with the version it reads.
func (f *fleet) rewrite(w int, key authority.Key, payload string) error {
	s, ctx := f.stores[w], context.Background()
	var res authority.CompareExchangeResult
	err := f.retried(func() error {
		read, err := s.ReadAuthority(ctx, key)
		if err != nil {
			return err
		}
		if read.Kind != authority.KindSnapshot {
			return fmt.Errorf("row %s is %s: an acknowledged write was lost", key, read.Kind)
		}
		if f.rowPayload(key) != string(read.Snapshot.Payload) {
			return fmt.Errorf("row %s reads %q, acknowledged %q: stale or lost", key, read.Snapshot.Payload, f.rowPayload(key))
		}
		res, err = s.CompareExchangeAuthority(ctx, key, read.Snapshot.StoreVersion, authority.Put([]byte(payload)))
		return err
	})
	if err != nil {
		return fmt.Errorf("rewrite %s: %w", key, err)
	}
	if res.Kind != authority.KindStored {
		return fmt.Errorf("rewrite %s: %s (only its writer writes it)", key, res.Kind)
	}
	return f.acknowledged(w, key, payload)
}

func (f *fleet) rowPayload(key authority.Key) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rows[key]
}

// acknowledged records an acknowledged write and reads it back through
// another writer's store: it must read it.
func (f *fleet) acknowledged(w int, key authority.Key, payload string) error {
	f.mu.Lock()
	f.rows[key] = payload
	f.mu.Unlock()
	f.acked.Add(1)
	other := f.stores[(w+1)%len(f.stores)]
	read, err := other.ReadAuthority(context.Background(), key)
	if err != nil {
		return fmt.Errorf("reading back %s: %w", key, err)
	}
	if read.Kind != authority.KindSnapshot || string(read.Snapshot.Payload) != payload {
		return fmt.Errorf("stale read: %s reads %v through another store right after %q was acknowledged", key, read.Kind, payload)
	}
	return nil
}

// verify reads every acknowledged row through a store opened on the map of
// cs[:n] and checks each row is in exactly one shard.
func (f *fleet) verify(cs []etcdstore.Config, n int) {
	f.t.Helper()
	s := openStore(f.t, cs, n, int64(n), nil)
	f.mu.Lock()
	defer f.mu.Unlock()
	for key, payload := range f.rows {
		read, err := s.ReadAuthority(context.Background(), key)
		require.NoError(f.t, err)
		require.Equal(f.t, authority.KindSnapshot, read.Kind, "acknowledged row %s lost", key)
		require.Equal(f.t, payload, string(read.Snapshot.Payload), "row %s", key)
	}
	rows := placed(f.t, cs, n)
	require.Len(f.t, rows, len(f.rows), "rows in the shards")
}

func reserveRequest(id string, target authority.CreationTarget) authority.ReserveRequest {
	sum := sha256.Sum256([]byte(id))
	return authority.ReserveRequest{
		Key: authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: id},
		Intent: authority.CreationIntent{StableType: conformance.DefaultStableType, RequestContentReference: "ref-" + id,
			RequestSHA256: sum[:], RequestEncodedSize: int64(len(id))},
		Target:          target,
		CreatingPayload: []byte("creating " + id),
		Capacity:        conformance.Capacity(authority.ObjectUserSpot, conformance.DefaultStableType),
	}
}

// TestGrowUnderWriters: three writers, each a store of its own, create and
// rewrite rows while the map grows from one shard to two, the job killed
// once mid-copy and resumed, then from two to three, the job killed once
// mid-switch (the next map in force in the new cluster, not yet in the
// sources) and resumed. Every write acknowledged reads back right away
// through another store and at the end through a store on the final map;
// every row is in exactly one shard.
func TestGrowUnderWriters(t *testing.T) {
	cs := clusters(t)
	f := newFleet(t, cs, 1, 3)
	f.fill(120)
	f.start()
	killed := 0
	for n := 1; n < clusterCount; n++ {
		ctx, cancel := context.WithCancel(context.Background())
		pages := 0
		cfg := reshard.Config{Shards: cs[:n], Add: cs[n], LeaseWait: 5 * time.Second, AggregateWait: time.Second}
		cfg.Step = func(step string) {
			switch {
			case n == 1 && strings.HasPrefix(step, "copying shard 0 after"):
				if pages++; pages == 2 {
					cancel()
				}
			case n == 2 && step == "switching shard 0":
				cancel()
			}
		}
		_, err := reshard.Run(ctx, cfg)
		cancel()
		require.ErrorIs(t, err, context.Canceled, "the job was to be killed")
		killed++
		cfg.Step = nil
		p, err := reshard.Run(context.Background(), cfg)
		require.NoError(t, err)
		require.Equal(t, "done", p.Phase)
		t.Logf("grow %d→%d: %s", n, n+1, p)
	}
	time.Sleep(200 * time.Millisecond) // writes under the final map
	f.halt()
	f.verify(cs, clusterCount)
	t.Logf("reshard: from=1 to=%d rows=%d acked=%d refused=%d max-refused-ms=%d resumed-after-kill=%d",
		clusterCount, len(f.rows), f.acked.Load(), f.refused.Load(), time.Duration(f.maxRefused.Load()).Milliseconds(), killed)
}
