package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The bench's cluster: two owners on two nodes of one mesh.
const (
	benchMesh       = "bench"
	benchStableType = "bench.Spot"
	benchOwnerTTL   = time.Minute
	benchAggParts   = 4
	benchPage       = authority.MaxScanLimit
	benchMixedPage  = 100
)

var benchTargets = [2]authority.CreationTarget{
	{MeshName: benchMesh, NodeRID: "node-a", NodeLifecycleGeneration: 1, Owner: authority.OwnerToken{OwnerID: "owner-a", LeaseGeneration: 1}},
	{MeshName: benchMesh, NodeRID: "node-b", NodeLifecycleGeneration: 1, Owner: authority.OwnerToken{OwnerID: "owner-b", LeaseGeneration: 1}},
}

// benchOp is one op of client on its i-th call.
type benchOp func(ctx context.Context, client, i int) error

// run opens the store in the run's namespace, creates the rows, and
// measures the workload and then the baseline.
func (b *benchRun) run(ctx context.Context) error {
	s, err := etcdstore.New(ctx, etcdstore.Config{Client: b.c, Namespace: b.ns})
	if err != nil {
		return err
	}
	b.store = s
	for _, t := range benchTargets {
		if err := s.MarkLive(ctx, t.Descriptor(), t.NodeLifecycleGeneration, t.Owner, benchOwnerTTL); err != nil {
			return err
		}
	}
	b.view = benchView{Workload: b.o.workload, Clients: b.o.clients, Rows: b.o.rows, PayloadBytes: b.o.payloadBytes,
		Namespace: b.ns, Duration: b.o.duration.String()}
	w := &benchWorkload{s: s, payload: make([]byte, b.o.payloadBytes), clients: b.o.clients}
	if err := b.fill(ctx, w); err != nil {
		return err
	}
	op := w.op(b.o.workload)
	store, err := b.measure(ctx, b.o.workload, op)
	b.view.Store = &store
	if err != nil {
		return err
	}
	value, err := w.rowValue(ctx, b.c)
	if err != nil {
		return err
	}
	base, ok := baselineOf(b.o.workload, b.c, b.ns, value)
	if !ok {
		return nil
	}
	b.view.BaselineShape = base.shape
	raw, err := b.measure(ctx, "raw etcd", base.op)
	b.view.Baseline = &raw
	if err != nil {
		return err
	}
	if raw.OpsPerSec > 0 {
		ratio := store.OpsPerSec / raw.OpsPerSec
		b.view.Ratio = &ratio
	}
	return nil
}

// fill creates --rows active rows (at least benchAggParts a client for
// aggregate, one a client for cas and mixed) through the store.
func (b *benchRun) fill(ctx context.Context, w *benchWorkload) error {
	n := b.o.rows
	switch b.o.workload {
	case workloadAggregate:
		n = max(n, benchAggParts*b.o.clients)
	case workloadCAS, workloadMixed:
		n = max(n, b.o.clients)
	}
	w.versions = make([]authority.StoreVersion, n)
	fmt.Fprintf(b.g.stderr, "bench: creating %d rows in %s\n", n, b.ns)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, min(n, 32))
	for g := range errs {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n && errs[g] == nil; i = int(next.Add(1) - 1) {
				row, err := w.reserveCommit(ctx, benchRowID(i), benchTargets[0])
				if err != nil {
					errs[g] = fmt.Errorf("create row %d: %w", i, err)
					return
				}
				w.versions[i] = row.StoreVersion
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func benchRowID(i int) string { return fmt.Sprintf("row-%08d", i) }

// benchWorkload holds the rows the ops work on; each client touches only
// its own rows, so no op conflicts with another.
type benchWorkload struct {
	s        *etcdstore.Store
	payload  []byte
	clients  int
	versions []authority.StoreVersion
	// owners is, per client, the index of the owner its aggregate rows
	// are on.
	owners []int
}

// op is the workload's op.
func (w *benchWorkload) op(workload string) benchOp {
	switch workload {
	case workloadReserveCommit:
		return func(ctx context.Context, client, i int) error {
			_, err := w.reserveCommit(ctx, "rc-"+strconv.Itoa(client)+"-"+strconv.Itoa(i), benchTargets[0])
			return err
		}
	case workloadCAS:
		return func(ctx context.Context, client, _ int) error { return w.cas(ctx, client) }
	case workloadAggregate:
		w.owners = make([]int, w.clients)
		return w.aggregate
	case workloadList:
		return w.listPages(benchPage)
	default:
		return w.mixed()
	}
}

// mixed: per 10 ops of a client, 2 reserve-commits, 6 CAS, 1 page of 100
// and 1 read.
func (w *benchWorkload) mixed() benchOp {
	list := w.listPages(benchMixedPage)
	return func(ctx context.Context, client, i int) error {
		switch i % 10 {
		case 0, 5:
			_, err := w.reserveCommit(ctx, "mx-"+strconv.Itoa(client)+"-"+strconv.Itoa(i), benchTargets[0])
			return err
		case 4:
			return list(ctx, client, i)
		case 9:
			key, err := authority.EncodeKey(authority.ObjectUserSpot, benchRowID(client))
			if err != nil {
				return err
			}
			res, err := w.s.ReadAuthority(ctx, key)
			if err == nil && res.Kind != authority.KindSnapshot {
				err = fmt.Errorf("read %s: %s", key, res.Kind)
			}
			return err
		default:
			return w.cas(ctx, client)
		}
	}
}

// reserveCommit reserves and commits a User Spot on target.
func (w *benchWorkload) reserveCommit(ctx context.Context, id string, target authority.CreationTarget) (*authority.Snapshot, error) {
	sum := sha256.Sum256([]byte(id))
	key := authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: id}
	res, err := w.s.Reserve(ctx, authority.ReserveRequest{
		Key: key,
		Intent: authority.CreationIntent{StableType: benchStableType, RequestContentReference: "bench-" + id,
			RequestSHA256: sum[:], RequestEncodedSize: int64(len(id))},
		Target: target, CreatingPayload: w.payload, Capacity: benchSpotCapacity(1),
	})
	if err != nil {
		return nil, err
	}
	if res.Kind != authority.KindReserved {
		return nil, fmt.Errorf("reserve %s: %s", id, res.Kind)
	}
	c, err := w.s.Commit(ctx, authority.CommitRequest{Key: key, ReservationID: res.ReservationID,
		ExpectedStoreVersion: res.Creating.StoreVersion, Target: target, ReadyPayload: w.payload})
	if err != nil {
		return nil, err
	}
	if c.Kind != authority.KindCommitted {
		return nil, fmt.Errorf("commit %s: %s", id, c.Kind)
	}
	return c.Ready, nil
}

func benchSpotCapacity(n int64) authority.CapacityVector {
	return authority.CapacityVector{Spots: n, SpotType: &authority.SpotTypeCapacity{
		ObjectKind: authority.ObjectUserSpot, StableType: benchStableType, Count: n}}
}

// cas puts the payload on the client's own row (row i = client i).
func (w *benchWorkload) cas(ctx context.Context, client int) error {
	key, err := authority.EncodeKey(authority.ObjectUserSpot, benchRowID(client))
	if err != nil {
		return err
	}
	res, err := w.s.CompareExchangeAuthority(ctx, key, w.versions[client], authority.Put(w.payload))
	if err != nil {
		return err
	}
	if res.Kind != authority.KindStored {
		return fmt.Errorf("cas %s: %s", key, res.Kind)
	}
	w.versions[client] = res.Snapshot.StoreVersion
	return nil
}

// aggregate moves the client's benchAggParts rows to the other owner.
func (w *benchWorkload) aggregate(ctx context.Context, client, i int) error {
	to := 1 - w.owners[client]
	target := benchTargets[to]
	digest := sha256.Sum256([]byte("bench"))
	req := authority.AggregatePrepareRequest{
		AggregateID: "agg-" + strconv.Itoa(client) + "-" + strconv.Itoa(i), AggregateGeneration: 1,
		TargetOwner: target.Owner, TargetDescriptor: target.Descriptor(),
		TargetDescriptorLifecycleGeneration: target.NodeLifecycleGeneration,
		Capacity:                            benchSpotCapacity(benchAggParts), InventoryDigest: digest[:],
	}
	for p := range benchAggParts {
		j := client*benchAggParts + p
		key, err := authority.EncodeKey(authority.ObjectUserSpot, benchRowID(j))
		if err != nil {
			return err
		}
		req.Participants = append(req.Participants, authority.AggregateParticipant{AuthorityKey: key,
			ExpectedStoreVersion: w.versions[j], OwnerTransition: authority.TransitionNewOwner, AuthorityPayload: w.payload})
	}
	pr, err := w.s.PrepareAggregate(ctx, req)
	if err != nil {
		return err
	}
	if pr.Kind != authority.KindPrepared {
		return fmt.Errorf("prepare %s: %s", req.AggregateID, pr.Kind)
	}
	cr, err := w.s.CommitAggregate(ctx, pr.Fence)
	if err != nil {
		return err
	}
	if cr.Kind != authority.KindCommitted {
		return fmt.Errorf("commit %s: %s", req.AggregateID, cr.Kind)
	}
	w.owners[client] = to
	// the commit does not return the rows' new versions: read them
	for p, part := range req.Participants {
		res, err := w.s.ReadAuthority(ctx, part.AuthorityKey)
		if err != nil {
			return err
		}
		if res.Kind != authority.KindSnapshot {
			return fmt.Errorf("read %s: %s", part.AuthorityKey, res.Kind)
		}
		w.versions[client*benchAggParts+p] = res.Snapshot.StoreVersion
	}
	return nil
}

// listPages pages through the User Spots, limit a page; each client keeps
// its own cursor and starts over at the end.
func (w *benchWorkload) listPages(limit int) benchOp {
	cursors := make([]authority.ScanCursor, w.clients)
	prefix := authority.KindPrefix(authority.ObjectUserSpot)
	return func(ctx context.Context, client, _ int) error {
		res, err := w.s.ListAuthorities(ctx, prefix, cursors[client], limit)
		if err != nil {
			return err
		}
		if res.Kind != authority.KindPage || len(res.Items) == 0 {
			return fmt.Errorf("list: %s, %d items", res.Kind, len(res.Items))
		}
		cursors[client] = res.NextCursor
		return nil
	}
}

// rowValue is the stored value of row 0, the size the baseline writes.
func (w *benchWorkload) rowValue(ctx context.Context, c *clientv3.Client) (string, error) {
	key, err := authority.EncodeKey(authority.ObjectUserSpot, benchRowID(0))
	if err != nil {
		return "", err
	}
	resp, err := c.Get(ctx, schema.Prefix(w.s.Namespace(), schema.EntryRow)+string(key))
	if err != nil {
		return "", err
	}
	if len(resp.Kvs) != 1 {
		return "", fmt.Errorf("row %s is missing", key)
	}
	return string(resp.Kvs[0].Value), nil
}

// rawTxnOp is the baseline: one Txn comparing a new key's mod revision to 0
// and putting value on it.
func rawTxnOp(c *clientv3.Client, prefix, value string) benchOp {
	return func(ctx context.Context, client, i int) error {
		key := prefix + strconv.Itoa(client) + "/" + strconv.Itoa(i)
		resp, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).Then(clientv3.OpPut(key, value)).Commit()
		if err == nil && !resp.Succeeded {
			err = fmt.Errorf("raw txn on %s: compare failed", key)
		}
		return err
	}
}
