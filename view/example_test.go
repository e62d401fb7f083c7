package view_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/memory"
	"github.com/zlink-systems/authority/view"
)

// Example keeps the Actor rows in a local view and reads one back from
// memory: consistently (it sees every write completed before it), and
// bounded-stale.
func Example() {
	ctx := context.Background()
	live := memory.NewLiveSet()
	store := memory.New(memory.Config{Liveness: live})
	node := authority.NodeDescriptor{MeshName: "mesh", RID: "node-1"}
	owner := authority.OwnerToken{OwnerID: "runtime-1", LeaseGeneration: 1}
	live.Set(node, 1, owner, true)

	v, err := view.New(ctx, store, view.Config{Prefix: authority.KindPrefix(authority.ObjectActor)})
	if err != nil {
		panic(err)
	}
	defer v.Close()

	sum := sha256.Sum256([]byte("request"))
	res, _ := store.Reserve(ctx, authority.ReserveRequest{
		Key:      authority.ObjectKey{Kind: authority.ObjectActor, GlobalID: "greeter"},
		Intent:   authority.CreationIntent{StableType: "Greeter", RequestContentReference: "inline", RequestSHA256: sum[:]},
		Target:   authority.CreationTarget{MeshName: node.MeshName, NodeRID: node.RID, NodeLifecycleGeneration: 1, Owner: owner},
		Capacity: authority.CapacityVector{Actors: 1},
	})
	key, _ := authority.EncodeKey(authority.ObjectActor, "greeter")

	read, _ := v.Read(ctx, key, view.Freshness{}) // consistent: sees the reservation
	fmt.Println(read.Kind, read.Snapshot.Allocation.State, read.Snapshot.StoreVersion == res.Creating.StoreVersion)
	stale, _ := v.Read(ctx, key, view.Freshness{MaxStaleness: time.Second})
	fmt.Println(stale.Kind, stale.Revision == read.Revision)
	// Output:
	// snapshot reserved true
	// snapshot true
}
