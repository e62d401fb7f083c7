// Command takeover is a small multi-node "runtime" on the authority store:
// three nodes on one embedded etcd server each hold an owner lease and place
// User Spots; node-b then crashes (its process stops renewing its lease, and
// etcd expires it), and node-a, seeing node-b's owner no longer live, takes
// every object of node-b over with one aggregate move.
//
//	go run ./examples/takeover
//
// It prints each step, and "took over N objects of node-b: ..." when the
// move committed. CI runs it (.ci/run) and so does its test.
package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// namespace is where the runtime's authority rows live.
const namespace = "/takeover/v1/"

// leaseTTL is the owner leases' TTL: how long a crashed node's objects stay
// fenced before another node may take them over.
const leaseTTL = 2 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "takeover:", err)
		stop()
		os.Exit(1)
	}
}

// node is one member of the runtime: its own store (its own etcd client, as
// a separate process would have) and owner lease.
type node struct {
	desc   authority.NodeDescriptor
	client *clientv3.Client // the node's own connection, so crash can cut it
	store  *etcdstore.Store
	lease  *etcdstore.OwnerLease
}

// run starts embedded etcd and the three nodes, places objects, crashes
// node-b and lets node-a take its objects over, reporting to out.
func run(ctx context.Context, out io.Writer) error {
	endpoint, stopEtcd, err := throwawayEtcd(ctx)
	if err != nil {
		return err
	}
	defer stopEtcd()
	fmt.Fprintf(out, "embedded etcd on %s\n", endpoint)

	nodes := map[string]*node{}
	defer func() {
		for _, n := range nodes {
			n.stop()
		}
	}()
	for _, name := range []string{"node-a", "node-b", "node-c"} {
		n, err := startNode(ctx, endpoint, name)
		if err != nil {
			return err
		}
		nodes[name] = n
		for i := 1; i <= 2; i++ {
			if err := n.place(ctx, fmt.Sprintf("cart-%s-%d", name[len(name)-1:], i)); err != nil {
				return err
			}
		}
		fmt.Fprintf(out, "%s: owner lease %s generation %d, placed 2 carts\n",
			name, n.lease.Token().OwnerID, n.lease.Token().LeaseGeneration)
	}
	if err := printPlacement(ctx, out, nodes["node-a"].store); err != nil {
		return err
	}

	dead := nodes["node-b"]
	deadOwner := dead.lease.Token()
	dead.crash()
	crashed := time.Now()
	fmt.Fprintln(out, "node-b crashed: its lease is no longer renewed")

	survivor := nodes["node-a"]
	if err := survivor.awaitDead(ctx, dead.desc, deadOwner); err != nil {
		return err
	}
	fmt.Fprintf(out, "node-a: node-b's owner lease expired at etcd after %.1fs\n", time.Since(crashed).Seconds())
	keys, err := survivor.takeOver(ctx, deadOwner)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "took over %d objects of node-b: %v\n", len(keys), keys)
	return printPlacement(ctx, out, survivor.store)
}

// startNode opens a node's store on endpoint and acquires its owner lease.
func startNode(ctx context.Context, endpoint, name string) (*node, error) {
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	store, err := etcdstore.New(ctx, etcdstore.Config{Client: client, Namespace: namespace, RequestTimeout: 5 * time.Second})
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	n := &node{desc: authority.NodeDescriptor{MeshName: "demo", RID: name}, client: client, store: store}
	if n.lease, err = store.Registry().Acquire(ctx, n.desc, 1, "owner-"+name, leaseTTL); err != nil {
		_ = store.Close()
		_ = client.Close()
		return nil, err
	}
	return n, nil
}

// place creates a User Spot on the node: reserve, then commit.
func (n *node) place(ctx context.Context, id string) error {
	request := []byte("create " + id)
	sum := sha256.Sum256(request)
	req := authority.ReserveRequest{
		Key: authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: id},
		Intent: authority.CreationIntent{
			StableType: "cart", RequestContentReference: "inline:" + id,
			RequestSHA256: sum[:], RequestEncodedSize: int64(len(request)),
		},
		Target: authority.CreationTarget{
			MeshName: n.desc.MeshName, NodeRID: n.desc.RID, NodeLifecycleGeneration: 1, Owner: n.lease.Token(),
		},
		CreatingPayload: []byte("creating"),
		Capacity: authority.CapacityVector{Spots: 1, SpotType: &authority.SpotTypeCapacity{
			ObjectKind: authority.ObjectUserSpot, StableType: "cart", Count: 1,
		}},
	}
	reserved, err := n.store.Reserve(ctx, req)
	if err != nil {
		return err
	}
	if reserved.Kind != authority.KindReserved {
		return fmt.Errorf("reserving %s: %s", id, reserved.Kind)
	}
	committed, err := n.store.Commit(ctx, authority.CommitRequest{
		Key: req.Key, ReservationID: reserved.ReservationID, ExpectedStoreVersion: reserved.Creating.StoreVersion,
		Target: req.Target, ReadyPayload: []byte("cart " + id + " on " + n.desc.RID),
	})
	if err != nil {
		return err
	}
	if committed.Kind != authority.KindCommitted {
		return fmt.Errorf("committing %s: %s", id, committed.Kind)
	}
	return nil
}

// awaitDead waits until owner is no longer live on node: its lease expired
// at etcd and took its liveness key with it.
func (n *node) awaitDead(ctx context.Context, node authority.NodeDescriptor, owner authority.OwnerToken) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		live, err := n.store.IsTargetLive(ctx, node, 1, owner)
		if err != nil {
			return err
		}
		if !live {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// takeOver moves every active row of owner onto this node's lease with one
// aggregate: prepare (checks each row at the version read and reserves the
// capacity here), then commit. It returns the keys it moved.
func (n *node) takeOver(ctx context.Context, owner authority.OwnerToken) ([]authority.Key, error) {
	req := authority.AggregatePrepareRequest{
		AggregateID: "takeover/" + owner.OwnerID, AggregateGeneration: owner.LeaseGeneration,
		TargetOwner: n.lease.Token(), TargetDescriptor: n.desc, TargetDescriptorLifecycleGeneration: 1,
	}
	var keys []authority.Key
	var cursor authority.ScanCursor
	for {
		page, err := n.store.ListAuthorities(ctx, "", cursor, authority.MaxScanLimit)
		if err != nil {
			return nil, err
		}
		if page.Kind != authority.KindPage {
			return nil, fmt.Errorf("listing rows: %s", page.Kind)
		}
		for _, item := range page.Items {
			s := item.Snapshot
			if s.Owner() != owner || s.Allocation.State != authority.AllocationActive {
				continue
			}
			if req.Capacity, err = authority.AddCapacity(req.Capacity, s.Allocation.Capacity); err != nil {
				return nil, err
			}
			req.Participants = append(req.Participants, authority.AggregateParticipant{
				AuthorityKey: item.Key, ExpectedStoreVersion: s.StoreVersion,
				OwnerTransition:  authority.TransitionNewOwner,
				AuthorityPayload: append(s.Payload, " (taken over by "+n.desc.RID+")"...),
			})
			keys = append(keys, item.Key)
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	digest := sha256.Sum256(fmt.Append(nil, keys))
	req.InventoryDigest = digest[:]
	prepared, err := n.store.PrepareAggregate(ctx, req)
	if err != nil {
		return nil, err
	}
	if prepared.Kind != authority.KindPrepared && prepared.Kind != authority.KindAlreadyPrepared {
		return nil, fmt.Errorf("preparing the take-over: %s", prepared.Kind)
	}
	committed, err := n.store.CommitAggregate(ctx, prepared.Fence)
	if err != nil {
		return nil, err
	}
	if committed.Kind != authority.KindCommitted && committed.Kind != authority.KindAlreadyCommitted {
		return nil, fmt.Errorf("committing the take-over: %s", committed.Kind)
	}
	return keys, nil
}

// crash stops the node as a killed process would: its connection goes
// first, so the lease is not revoked (Store.Close would revoke it), and etcd
// expires it after its TTL.
func (n *node) crash() {
	_ = n.client.Close()
	_ = n.store.Close()
	<-n.lease.Done()
	n.store = nil
}

// stop shuts a live node down: its lease is revoked, its rows stay.
func (n *node) stop() {
	if n.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = n.lease.Close(ctx)
	_ = n.store.Close()
	_ = n.client.Close()
	n.store = nil
}

// printPlacement lists every row: key, owner and node.
func printPlacement(ctx context.Context, out io.Writer, store *etcdstore.Store) error {
	page, err := store.ListAuthorities(ctx, "", "", authority.MaxScanLimit)
	if err != nil {
		return err
	}
	for _, item := range page.Items {
		s := item.Snapshot
		fmt.Fprintf(out, "  %-22s owner %s@%d on %s\n", item.Key, s.OwnerID, s.OwnerLeaseGeneration, s.Allocation.Descriptor.RID)
	}
	return nil
}
