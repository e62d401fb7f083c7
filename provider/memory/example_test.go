package memory_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/memory"
)

// The nodes and owners of the examples. An owner token names one lease
// generation of an owner; the memory store learns which ones are live from
// its LivenessOracle (here a LiveSet driven by hand).
var (
	nodeA  = authority.NodeDescriptor{MeshName: "mesh", RID: "node-a"}
	nodeB  = authority.NodeDescriptor{MeshName: "mesh", RID: "node-b"}
	ownerA = authority.OwnerToken{OwnerID: "owner-a", LeaseGeneration: 1}
	ownerB = authority.OwnerToken{OwnerID: "owner-b", LeaseGeneration: 1}
)

// newStore returns an empty store on which owner-a (node-a) and owner-b
// (node-b) are live, and the LiveSet that says so.
func newStore() (*memory.Store, *memory.LiveSet) {
	live := memory.NewLiveSet()
	live.Set(nodeA, 1, ownerA, true)
	live.Set(nodeB, 1, ownerB, true)
	return memory.New(memory.Config{Liveness: live}), live
}

// reserveRequest returns the reservation of a new object kind/id of stable
// type "cart" on owner's node: its creation request (content reference, its
// SHA-256 and size, as the caller stored them), the payload of the reserved
// row, and the capacity it takes.
func reserveRequest(kind authority.ObjectKind, id string, node authority.NodeDescriptor, owner authority.OwnerToken) authority.ReserveRequest {
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
		Target:          authority.CreationTarget{MeshName: node.MeshName, NodeRID: node.RID, NodeLifecycleGeneration: 1, Owner: owner},
		CreatingPayload: []byte("creating"),
		Capacity:        capacity,
	}
}

// activeSpot reserves and commits a User Spot on owner-a, returning its row.
func activeSpot(ctx context.Context, s *memory.Store, id string) *authority.Snapshot {
	req := reserveRequest(authority.ObjectUserSpot, id, nodeA, ownerA)
	r, err := s.Reserve(ctx, req)
	if err != nil || r.Kind != authority.KindReserved {
		panic(fmt.Sprint("reserve: ", r.Kind, err))
	}
	c, err := s.Commit(ctx, authority.CommitRequest{
		Key: req.Key, ReservationID: r.ReservationID, ExpectedStoreVersion: r.Creating.StoreVersion,
		Target: req.Target, ReadyPayload: []byte("ready " + id),
	})
	if err != nil || c.Kind != authority.KindCommitted {
		panic(fmt.Sprint("commit: ", c.Kind, err))
	}
	return c.Ready
}

// A Spot is created in two steps: Reserve writes a reserved row (and takes
// its capacity), Commit makes it active. A retried Commit is answered
// alreadyCommitted, so a commit whose reply was lost is simply sent again.
func ExampleStore_Commit() {
	ctx := context.Background()
	s, _ := newStore()

	req := reserveRequest(authority.ObjectUserSpot, "cart-42", nodeA, ownerA)
	reserved, err := s.Reserve(ctx, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("reserve:", reserved.Kind, reserved.Creating.Allocation.State, string(reserved.Creating.Payload))

	commit := authority.CommitRequest{
		Key:                  req.Key,
		ReservationID:        reserved.ReservationID,         // from the reservation
		ExpectedStoreVersion: reserved.Creating.StoreVersion, // the reserved row's version
		Target:               req.Target,
		ReadyPayload:         []byte("ready"),
	}
	for range 2 {
		res, err := s.Commit(ctx, commit)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("commit:", res.Kind, res.Ready.Allocation.State, string(res.Ready.Payload))
	}
	usage, _ := s.CapacityUsage(ctx, nodeA, 1, authority.ObjectUserSpot, "cart")
	fmt.Printf("node-a user_spot/cart: %d active, %d reserved\n", usage.Active, usage.Reserved)
	// Output:
	// reserve: reserved reserved creating
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
	s, _ := newStore()

	req := reserveRequest(authority.ObjectActor, "player-7", nodeA, ownerA)
	reserved, err := s.Reserve(ctx, req)
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
	res, err := s.CompleteCreation(ctx, authority.CompleteCreationRequest{
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

	terminal, err := s.ReadCreationTerminal(ctx, op)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("terminal:", terminal.Kind, terminal.Record.State, string(terminal.Record.TerminalEnvelope))
	// Output:
	// complete: created active
	// terminal: found created created player-7
}

// CompareExchangeAuthority writes a row only at the version the caller read:
// a write based on an older read is a conflict that returns the current row.
func ExampleStore_CompareExchangeAuthority() {
	ctx := context.Background()
	s, _ := newStore()
	row := activeSpot(ctx, s, "cart-1")
	key, _ := authority.EncodeKey(authority.ObjectUserSpot, "cart-1")

	res, err := s.CompareExchangeAuthority(ctx, key, row.StoreVersion, authority.Put([]byte("v2")))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("put at the read version:", res.Kind, string(res.Snapshot.Payload))

	res, err = s.CompareExchangeAuthority(ctx, key, row.StoreVersion, authority.Put([]byte("v3")))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("put at an old version:", res.Kind, "; the row is", string(res.Current.Snapshot.Payload))
	// Output:
	// put at the read version: stored v2
	// put at an old version: conflict ; the row is v2
}

// ListAuthorities pages through the rows under a prefix in key order; a
// page's NextCursor continues the listing, and an empty one ends it.
func ExampleStore_ListAuthorities() {
	ctx := context.Background()
	s, _ := newStore()
	for _, id := range []string{"cart-1", "cart-2", "cart-3", "cart-4", "cart-5"} {
		activeSpot(ctx, s, id)
	}
	var cursor authority.ScanCursor
	for page := 1; ; page++ {
		res, err := s.ListAuthorities(ctx, authority.KindPrefix(authority.ObjectUserSpot), cursor, 2)
		if err != nil || res.Kind != authority.KindPage {
			fmt.Println("listing:", res.Kind, err) // KindScanExpired: start again
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
// ones take on the target node, CommitAggregate moves them.
func ExampleStore_PrepareAggregate() {
	ctx := context.Background()
	s, _ := newStore()
	row := activeSpot(ctx, s, "cart-9")
	key, _ := authority.EncodeKey(authority.ObjectUserSpot, "cart-9")

	digest := sha256.Sum256([]byte("inventory of move-1"))
	req := authority.AggregatePrepareRequest{
		AggregateID:                         "move-1",
		AggregateGeneration:                 1,
		TargetOwner:                         ownerB,
		TargetDescriptor:                    nodeB,
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
	prepared, err := s.PrepareAggregate(ctx, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("prepare:", prepared.Kind)
	committed, err := s.CommitAggregate(ctx, prepared.Fence)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("commit:", committed.Kind)

	read, _ := s.ReadAuthority(ctx, key)
	fmt.Println("owner:", read.Snapshot.OwnerID, "on", read.Snapshot.Allocation.Descriptor.RID, "payload:", string(read.Snapshot.Payload))
	// Output:
	// prepare: prepared
	// commit: committed
	// owner: owner-b on node-b payload: moved to node-b
}

// When an owner's lease is lost, its rows are fenced: no put passes. The
// owner takes a new lease generation and moves each row onto it with
// RebindOwnerLease (the etcd provider's OwnerLease.RebindRows does this for
// every row of the old generation).
func ExampleLiveSet() {
	ctx := context.Background()
	s, live := newStore()
	row := activeSpot(ctx, s, "cart-3")
	key, _ := authority.EncodeKey(authority.ObjectUserSpot, "cart-3")

	live.Set(nodeA, 1, ownerA, false) // the lease of owner-a generation 1 is lost
	res, _ := s.CompareExchangeAuthority(ctx, key, row.StoreVersion, authority.Put([]byte("v2")))
	fmt.Println("put by the lost owner:", res.Kind)

	next := authority.OwnerToken{OwnerID: ownerA.OwnerID, LeaseGeneration: 2}
	live.Set(nodeA, 1, next, true) // a new lease generation
	res, _ = s.CompareExchangeAuthority(ctx, key, row.StoreVersion, authority.RebindOwnerLease(ownerA, next, row.Payload))
	fmt.Println("rebind:", res.Kind, "lease generation", res.Snapshot.OwnerLeaseGeneration)

	res, _ = s.CompareExchangeAuthority(ctx, key, res.Snapshot.StoreVersion, authority.Put([]byte("v2")))
	fmt.Println("put by the new generation:", res.Kind)
	// Output:
	// put by the lost owner: conflict
	// rebind: stored lease generation 2
	// put by the new generation: stored
}
