package etcd_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The examples run on the package's test server (embedded etcd, or the
// cluster of AUTHORITY_ETCD_ENDPOINTS), each in a fresh namespace.

// ExampleNew opens a store on an existing cluster and keeps an owner lease,
// taking the next generation when the lease is lost. It is README's
// "Plugging the provider" snippet (TestReadmeSnippetIsExampleNew keeps the
// two equal); it is compiled, not run: it needs your cluster.
func ExampleNew() {
	// README:begin
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	store, err := etcdstore.New(ctx, etcdstore.Config{
		Endpoints:       []string{"etcd1:2379", "etcd2:2379", "etcd3:2379"},
		CAFile:          "/etc/zlink/etcd-ca.pem", // TLS: CA alone verifies the server,
		CertFile:        "/etc/zlink/client.pem",  // cert+key authenticate the client
		KeyFile:         "/etc/zlink/client-key.pem",
		Username:        "zlink",
		Password:        os.Getenv("ZLINK_ETCD_PASSWORD"),
		Namespace:       "/zlink/authority/v1/", // every key lives under it; must end in "/"
		MaxTxnOps:       1024,                   // = the servers' --max-txn-ops
		MaxRequestBytes: 4 << 20,                // = the servers' --max-request-bytes
		RequestTimeout:  5 * time.Second,
	})
	if err != nil { // errors.Is(err, authority.ErrUnsupportedServer / ErrAccessDenied / ErrUnavailable)
		log.Fatalf("opening the authority store: %v", err)
	}
	defer func() { _ = store.Close() }()

	// Each node holds an owner lease; its liveness key fences every write of its rows.
	// The lifecycle is the node's lifecycle generation, from its runtime: the scope of its rows. A restart
	// that keeps the node's rows keeps it (README: "Node lifecycles and lease generations").
	node := authority.NodeDescriptor{MeshName: "mesh", RID: "node-1"}
	lifecycle, err := strconv.ParseInt(os.Getenv("ZLINK_NODE_LIFECYCLE"), 10, 64)
	if err != nil || lifecycle < 1 {
		log.Fatalf("ZLINK_NODE_LIFECYCLE must be the node's lifecycle generation (1, 2, …): %q", os.Getenv("ZLINK_NODE_LIFECYCLE"))
	}
	const owner, ttl = "owner-1", 10 * time.Second
	lease, err := store.Registry().Acquire(ctx, node, lifecycle, owner, ttl)
	if err != nil {
		log.Fatalf("acquiring the owner lease: %v", err)
	}
	for {
		select {
		case <-ctx.Done(): // shutting down: give the lease back (the rows stay)
			_ = lease.Close(context.Background())
			return
		case <-lease.Done(): // lost: every write of its rows now fails; stop them
			lost := lease.Token() // the next generation goes on the same lifecycle
			if lease, err = store.Registry().Acquire(ctx, node, lifecycle, owner, ttl); err != nil {
				log.Printf("acquiring the next lease generation: %v", err) // retry, or give the node up
				return
			}
			if _, err := lease.RebindRows(ctx, lost); err != nil {
				log.Printf("rows left on %v: %v", lost, err) // ErrUnavailable: call RebindRows again
			}
		}
	}
	// README:end
}

// exampleStore opens a store in a fresh namespace of the test server, as
// New(ctx, Config{Endpoints: ...}) would on yours, and returns it with a
// function that closes it and deletes the namespace.
func exampleStore(ctx context.Context) (*etcdstore.Store, func()) {
	ns := etcdtest.Namespace()
	store, err := etcdstore.New(ctx, etcdstore.Config{Client: shared, Namespace: ns})
	if err != nil {
		panic(err)
	}
	return store, func() {
		_ = store.Close()
		_, _ = shared.Delete(context.Background(), ns, clientv3.WithPrefix())
	}
}

// exampleLease acquires owner's lease on node (lifecycle 1).
func exampleLease(ctx context.Context, store *etcdstore.Store, node, owner string) *etcdstore.OwnerLease {
	lease, err := store.Registry().Acquire(ctx, authority.NodeDescriptor{MeshName: "mesh", RID: node}, 1, owner, 30*time.Second)
	if err != nil {
		panic(err)
	}
	return lease
}

// exampleReserve returns the reservation of a new object kind/id of stable
// type "cart" on the lease's node: its creation request (content reference,
// its SHA-256 and size, as the caller stored them), the payload of the
// reserved row, and the capacity it takes.
func exampleReserve(kind authority.ObjectKind, id string, node string, lease *etcdstore.OwnerLease) authority.ReserveRequest {
	request := []byte("create " + id)
	sum := sha256.Sum256(request)
	capacity := authority.CapacityVector{Actors: 1}
	if kind.IsSpot() {
		capacity = authority.CapacityVector{Spots: 1, SpotType: &authority.SpotTypeCapacity{ObjectKind: kind, StableType: "cart", Count: 1}}
	}
	return authority.ReserveRequest{
		Key: authority.ObjectKey{Kind: kind, GlobalID: id},
		Intent: authority.CreationIntent{
			StableType:              "cart",
			RequestContentReference: "blob:" + id,
			RequestSHA256:           sum[:],
			RequestEncodedSize:      int64(len(request)),
		},
		Target:          authority.CreationTarget{MeshName: "mesh", NodeRID: node, NodeLifecycleGeneration: 1, Owner: lease.Token()},
		CreatingPayload: []byte("creating"),
		Capacity:        capacity,
	}
}

// exampleSpot reserves and commits a User Spot on the lease's node.
func exampleSpot(ctx context.Context, store *etcdstore.Store, id, node string, lease *etcdstore.OwnerLease) *authority.Snapshot {
	req := exampleReserve(authority.ObjectUserSpot, id, node, lease)
	r, err := store.Reserve(ctx, req)
	if err != nil || r.Kind != authority.KindReserved {
		panic(fmt.Sprint("reserve: ", r.Kind, err))
	}
	c, err := store.Commit(ctx, authority.CommitRequest{
		Key: req.Key, ReservationID: r.ReservationID, ExpectedStoreVersion: r.Creating.StoreVersion,
		Target: req.Target, ReadyPayload: []byte("ready " + id),
	})
	if err != nil || c.Kind != authority.KindCommitted {
		panic(fmt.Sprint("commit: ", c.Kind, err))
	}
	return c.Ready
}

// A node takes an owner lease before it places objects: while the lease is
// held, its liveness key exists and writes of its rows pass their fence.
func ExampleRegistry_Acquire() {
	ctx := context.Background()
	store, done := exampleStore(ctx)
	defer done()

	node := authority.NodeDescriptor{MeshName: "mesh", RID: "node-a"}
	lease, err := store.Registry().Acquire(ctx, node, 1, "owner-a", 30*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	live, _ := store.IsTargetLive(ctx, node, 1, lease.Token())
	fmt.Printf("owner %s generation %d live: %v\n", lease.Token().OwnerID, lease.Token().LeaseGeneration, live)

	if err := lease.Close(ctx); err != nil { // revokes the lease: Done closes
		fmt.Println(err)
		return
	}
	<-lease.Done()
	live, _ = store.IsTargetLive(ctx, node, 1, lease.Token())
	fmt.Println("after Close live:", live)
	// Output:
	// owner owner-a generation 1 live: true
	// after Close live: false
}

// A Spot is created in two steps: Reserve writes a reserved row (and takes
// its capacity), Commit makes it active. A retried Commit is answered
// alreadyCommitted, so a commit whose reply was lost (ErrOutcomeUnknown) is
// simply sent again.
func ExampleStore_Commit() {
	ctx := context.Background()
	store, done := exampleStore(ctx)
	defer done()
	lease := exampleLease(ctx, store, "node-a", "owner-a")
	defer func() { _ = lease.Close(ctx) }()

	req := exampleReserve(authority.ObjectUserSpot, "cart-42", "node-a", lease)
	reserved, err := store.Reserve(ctx, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("reserve:", reserved.Kind, reserved.Creating.Allocation.State)

	commit := authority.CommitRequest{
		Key:                  req.Key,
		ReservationID:        reserved.ReservationID,         // from the reservation
		ExpectedStoreVersion: reserved.Creating.StoreVersion, // the reserved row's version
		Target:               req.Target,
		ReadyPayload:         []byte("ready"),
	}
	for range 2 {
		res, err := store.Commit(ctx, commit)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("commit:", res.Kind, res.Ready.Allocation.State, string(res.Ready.Payload))
	}
	usage, _ := store.CapacityUsage(ctx, req.Target.Descriptor(), 1, authority.ObjectUserSpot, "cart")
	fmt.Printf("node-a user_spot/cart: %d active, %d reserved\n", usage.Active, usage.Reserved)
	// Output:
	// reserve: reserved reserved
	// commit: committed active ready
	// commit: alreadyCommitted active ready
	// node-a user_spot/cart: 1 active, 0 reserved
}

// An Actor's creation ends with CompleteCreation, which makes the row active
// (created) or deletes it (rejected, failed) and publishes the creation's
// terminal, readable by its operation until the operation deadline plus
// five minutes.
func ExampleStore_CompleteCreation() {
	ctx := context.Background()
	store, done := exampleStore(ctx)
	defer done()
	lease := exampleLease(ctx, store, "node-a", "owner-a")
	defer func() { _ = lease.Close(ctx) }()

	req := exampleReserve(authority.ObjectActor, "player-7", "node-a", lease)
	reserved, err := store.Reserve(ctx, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	envelope := []byte("created player-7")
	sum := sha256.Sum256(envelope)
	op := authority.CreationOperation{
		SourceNodeRID:        "node-a", // the node that runs the creation operation
		SourceNodeGeneration: 1,
		OperationID:          authority.CreationOperationID{High: 1, Low: 42},
	}
	res, err := store.CompleteCreation(ctx, authority.CompleteCreationRequest{
		Key:                  req.Key,
		ReservationID:        reserved.ReservationID,
		ExpectedStoreVersion: reserved.Creating.StoreVersion,
		Target:               req.Target,
		Completion: authority.Completion{
			Kind:         authority.TerminalCreated,
			ReadyPayload: []byte("ready"),
			Terminal: &authority.TerminalPublication{
				Operation:              op,
				TerminalEnvelope:       envelope,
				TerminalEnvelopeSHA256: sum[:],
				OperationDeadline:      time.Now().Add(time.Minute),
			},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("complete:", res.Kind, res.Ready.Allocation.State)

	terminal, err := store.ReadCreationTerminal(ctx, op)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("terminal:", terminal.Kind, terminal.Record.State, string(terminal.Record.TerminalEnvelope))
	// Output:
	// complete: created active
	// terminal: found created created player-7
}

// CompareExchangeAuthority writes a row only at the version the caller read
// (one etcd Txn comparing the row's ModRevision and the owner's liveness
// key): a write based on an older read is a conflict that returns the
// current row.
func ExampleStore_CompareExchangeAuthority() {
	ctx := context.Background()
	store, done := exampleStore(ctx)
	defer done()
	lease := exampleLease(ctx, store, "node-a", "owner-a")
	defer func() { _ = lease.Close(ctx) }()
	row := exampleSpot(ctx, store, "cart-1", "node-a", lease)
	key, _ := authority.EncodeKey(authority.ObjectUserSpot, "cart-1")

	res, err := store.CompareExchangeAuthority(ctx, key, row.StoreVersion, authority.Put([]byte("v2")))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("put at the read version:", res.Kind, string(res.Snapshot.Payload))

	res, err = store.CompareExchangeAuthority(ctx, key, row.StoreVersion, authority.Put([]byte("v3")))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("put at an old version:", res.Kind, "; the row is", string(res.Current.Snapshot.Payload))
	// Output:
	// put at the read version: stored v2
	// put at an old version: conflict ; the row is v2
}

// ListAuthorities pages through the rows under a prefix in key order, every
// page at the listing's first revision; a page's NextCursor continues the
// listing, and an empty one ends it.
func ExampleStore_ListAuthorities() {
	ctx := context.Background()
	store, done := exampleStore(ctx)
	defer done()
	lease := exampleLease(ctx, store, "node-a", "owner-a")
	defer func() { _ = lease.Close(ctx) }()
	for _, id := range []string{"cart-1", "cart-2", "cart-3", "cart-4", "cart-5"} {
		exampleSpot(ctx, store, id, "node-a", lease)
	}
	var cursor authority.ScanCursor
	for page := 1; ; page++ {
		res, err := store.ListAuthorities(ctx, authority.KindPrefix(authority.ObjectUserSpot), cursor, 2)
		if err != nil || res.Kind != authority.KindPage {
			fmt.Println("listing:", res.Kind, err) // KindScanExpired: compacted, start again
			return
		}
		for _, item := range res.Items {
			fmt.Printf("page %d: %s %s\n", page, item.Key, item.Snapshot.Payload)
		}
		if res.NextCursor == "" {
			return
		}
		cursor = res.NextCursor
	}
	// Output:
	// page 1: user_spot/cart-1 ready cart-1
	// page 1: user_spot/cart-2 ready cart-2
	// page 2: user_spot/cart-3 ready cart-3
	// page 2: user_spot/cart-4 ready cart-4
	// page 3: user_spot/cart-5 ready cart-5
}

// An aggregate moves rows between owners atomically: PrepareAggregate checks
// the participants at their versions and reserves the capacity the newOwner
// ones take on the target node, CommitAggregate moves them in one Txn.
func ExampleStore_PrepareAggregate() {
	ctx := context.Background()
	store, done := exampleStore(ctx)
	defer done()
	leaseA := exampleLease(ctx, store, "node-a", "owner-a")
	defer func() { _ = leaseA.Close(ctx) }()
	leaseB := exampleLease(ctx, store, "node-b", "owner-b")
	defer func() { _ = leaseB.Close(ctx) }()
	row := exampleSpot(ctx, store, "cart-9", "node-a", leaseA)
	key, _ := authority.EncodeKey(authority.ObjectUserSpot, "cart-9")

	digest := sha256.Sum256([]byte("inventory of move-1"))
	req := authority.AggregatePrepareRequest{
		AggregateID:                         "move-1",
		AggregateGeneration:                 1,
		TargetOwner:                         leaseB.Token(),
		TargetDescriptor:                    authority.NodeDescriptor{MeshName: "mesh", RID: "node-b"},
		TargetDescriptorLifecycleGeneration: 1,
		Capacity:                            row.Allocation.Capacity, // the sum of the moving rows' capacity
		InventoryDigest:                     digest[:],
		Participants: []authority.AggregateParticipant{{
			AuthorityKey:         key,
			ExpectedStoreVersion: row.StoreVersion,
			OwnerTransition:      authority.TransitionNewOwner,
			AuthorityPayload:     []byte("moved to node-b"),
		}},
	}
	prepared, err := store.PrepareAggregate(ctx, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("prepare:", prepared.Kind)
	committed, err := store.CommitAggregate(ctx, prepared.Fence)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("commit:", committed.Kind)

	read, _ := store.ReadAuthority(ctx, key)
	fmt.Println("owner:", read.Snapshot.OwnerID, "on", read.Snapshot.Allocation.Descriptor.RID, "payload:", string(read.Snapshot.Payload))
	// Output:
	// prepare: prepared
	// commit: committed
	// owner: owner-b on node-b payload: moved to node-b
}

// When Done closes, the lease is lost and no write of its rows passes. The
// owner takes the next generation with Acquire and moves its rows onto it
// with RebindRows. (Here the lease is lost because it is closed; on a cluster
// it is lost when etcd expires it.)
func ExampleOwnerLease_RebindRows() {
	ctx := context.Background()
	store, done := exampleStore(ctx)
	defer done()
	node := authority.NodeDescriptor{MeshName: "mesh", RID: "node-a"}
	lease, err := store.Registry().Acquire(ctx, node, 1, "owner-a", 30*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	row := exampleSpot(ctx, store, "cart-5", "node-a", lease)
	key, _ := authority.EncodeKey(authority.ObjectUserSpot, "cart-5")

	_ = lease.Close(ctx) // the lease is lost
	<-lease.Done()
	res, _ := store.CompareExchangeAuthority(ctx, key, row.StoreVersion, authority.Put([]byte("v2")))
	fmt.Println("put by the lost generation:", res.Kind)

	lost := lease.Token()
	lease, err = store.Registry().Acquire(ctx, node, 1, "owner-a", 30*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = lease.Close(ctx) }()
	moved, err := lease.RebindRows(ctx, lost)
	if err != nil {
		fmt.Println(err) // ErrUnavailable: some rows kept changing, call it again
		return
	}
	fmt.Printf("moved %d row(s) from generation %d to %d\n", moved, lost.LeaseGeneration, lease.Token().LeaseGeneration)

	read, _ := store.ReadAuthority(ctx, key)
	res, _ = store.CompareExchangeAuthority(ctx, key, read.Snapshot.StoreVersion, authority.Put([]byte("v2")))
	fmt.Println("put by the new generation:", res.Kind)
	// Output:
	// put by the lost generation: conflict
	// moved 1 row(s) from generation 1 to 2
	// put by the new generation: stored
}

// WatchRows lists the rows under a prefix, then follows their changes in
// commit order, each once. A consumer saves each batch's Revision with what
// it applied; restarted, it resumes after it (FeedRequest.After) and gets
// every change made while it was stopped. When etcd compacted that history,
// the resumed feed fails with authority.ErrFeedCompacted (from WatchRows or
// its first Next): the consumer relists (FeedRequest.List) and replaces
// what it holds. Close feeds before the lease and the store.
// examples/rowfeed runs all of it, a compaction and a view included.
func ExampleStore_WatchRows() {
	ctx := context.Background()
	store, done := exampleStore(ctx)
	defer done()
	lease := exampleLease(ctx, store, "node-a", "owner-a")
	defer func() { _ = lease.Close(ctx) }()
	exampleSpot(ctx, store, "cart-1", "node-a", lease)
	carts := authority.KindPrefix(authority.ObjectUserSpot)

	feed, err := store.WatchRows(ctx, authority.FeedRequest{Prefix: carts, List: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	var saved int64 // the revision the consumer applied every change up to
	for done := false; !done; {
		batch, err := feed.Next(ctx)
		if err != nil {
			fmt.Println(err)
			return
		}
		for _, e := range batch.Events {
			fmt.Printf("%s: %s %s %q\n", batch.Kind, e.Kind, e.Key, e.Snapshot.Payload)
		}
		saved, done = batch.Revision, batch.Kind == authority.FeedSynced // the listing is whole
	}
	_ = feed.Close() // the consumer stops, having saved its revision

	exampleSpot(ctx, store, "cart-2", "node-a", lease) // reserved, then committed
	feed, err = store.WatchRows(ctx, authority.FeedRequest{Prefix: carts, After: saved})
	if err != nil { // authority.ErrFeedCompacted: relist
		fmt.Println(err)
		return
	}
	defer func() { _ = feed.Close() }()
	for seen := 0; seen < 2; {
		batch, err := feed.Next(ctx)
		if err != nil { // authority.ErrFeedCompacted: relist; others: resume after saved
			fmt.Println(err)
			return
		}
		for _, e := range batch.Events {
			fmt.Printf("%s: %s %s %q (after the saved revision: %v)\n", batch.Kind, e.Kind, e.Key, e.Snapshot.Payload, e.Revision > saved)
			seen++
		}
		saved = batch.Revision
	}
	// Output:
	// listed: created user_spot/cart-1 "ready cart-1"
	// changed: created user_spot/cart-2 "creating" (after the saved revision: true)
	// changed: updated user_spot/cart-2 "ready cart-2" (after the saved revision: true)
}
