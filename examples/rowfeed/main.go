// Command rowfeed shows a consumer of the row feed (authority.RowFeed) and a
// local read view (package view), on an embedded etcd server.
//
//	go run ./examples/rowfeed
//
// A cart index, a consumer that keeps every cart (User Spot) in memory with
// the revision it has applied them up to, lists the carts with WatchRows and
// follows their changes with Next. It stops and, restarted, resumes after the
// revision it saved: it gets every change made while it was stopped, and
// nothing twice. Then etcd compacts its history (as --auto-compaction-* does
// on your cluster) while the index is stopped: resuming fails with
// authority.ErrFeedCompacted, and the index relists. Last, a view answers
// reads from memory, consistently. Everything is closed in the order a
// program must close it: the view and any feed, the owner lease, the store,
// then the etcd client the program gave the store.
//
// It prints each step, and "relisted after ErrFeedCompacted: ..." when the
// index relisted. CI runs it (.ci/run) and so does its test.
package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"github.com/zlink-systems/authority/examples/throwawayetcd"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/view"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// namespace is where the example's authority rows live.
const namespace = "/rowfeed/v1/"

// node is where the carts are placed.
var node = authority.NodeDescriptor{MeshName: "demo", RID: "node-a"}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "rowfeed:", err)
		stop()
		os.Exit(1)
	}
}

// cartIndex is a feed consumer: the carts it follows (payload by key) and
// the revision it has applied every change up to. A real one saves both
// together; restarted, it resumes after revision (0: it lists).
type cartIndex struct {
	carts    map[authority.Key]string
	revision int64
}

// cartPrefix selects the rows the index follows: every User Spot.
var cartPrefix = authority.KindPrefix(authority.ObjectUserSpot)

// follow brings the index up to date from where it stopped: it applies
// every change up to revision upTo (a consumer that runs on follows until
// its ctx ends instead). When the history it needs is gone, it relists.
func (x *cartIndex) follow(ctx context.Context, out io.Writer, rows authority.RowFeed, upTo int64) error {
	err := x.followFeed(ctx, out, rows, upTo)
	if errors.Is(err, authority.ErrFeedCompacted) {
		// The changes after x.revision are gone: what the index holds can
		// no longer be brought up to date. Replace it with a new listing.
		fmt.Fprintf(out, "index: the history after revision %d is compacted (ErrFeedCompacted): relisting\n", x.revision)
		x.revision = 0
		if err = x.followFeed(ctx, out, rows, upTo); err == nil {
			fmt.Fprintf(out, "relisted after ErrFeedCompacted: %d carts at revision %d\n", len(x.carts), x.revision)
		}
	}
	return err
}

// followFeed opens one feed, after x.revision (or with a listing when it is
// 0), and applies its batches until the index reached upTo.
func (x *cartIndex) followFeed(ctx context.Context, out io.Writer, rows authority.RowFeed, upTo int64) error {
	feed, err := rows.WatchRows(ctx, authority.FeedRequest{Prefix: cartPrefix, List: x.revision == 0, After: x.revision})
	if err != nil {
		return err // ErrFeedCompacted when x.revision is older than etcd keeps
	}
	defer func() { _ = feed.Close() }()
	if x.revision != 0 {
		fmt.Fprintf(out, "index: resuming after revision %d\n", x.revision)
	}
	// A batch reaches upTo even when no cart changed after it: ask for
	// progress (etcd before 3.4.31 / 3.5.13 cannot promise it; only changes
	// move the index there).
	if err := feed.RequestProgress(ctx); err != nil && !errors.Is(err, authority.ErrUnsupportedServer) {
		return err
	}
	var listing map[authority.Key]string
	for x.revision < upTo {
		batch, err := feed.Next(ctx) // ErrFeedCompacted here too; other errors: resume later from x.revision
		if err != nil {
			return err
		}
		switch batch.Kind {
		case authority.FeedListed: // part of the listing: complete only at FeedSynced
			if listing == nil {
				listing = map[authority.Key]string{}
			}
			for _, e := range batch.Events {
				listing[e.Key] = string(e.Snapshot.Payload)
			}
			continue
		case authority.FeedSynced: // the listing replaces what the index held
			x.carts = listing
			if x.carts == nil {
				x.carts = map[authority.Key]string{}
			}
			fmt.Fprintf(out, "index: listed %d carts at revision %d: %v\n", len(x.carts), batch.Revision, slices.Sorted(maps.Keys(x.carts)))
		case authority.FeedChanged:
			for _, e := range batch.Events {
				if e.Kind == authority.FeedRemoved {
					delete(x.carts, e.Key)
					fmt.Fprintf(out, "index: %s %s at revision %d\n", e.Kind, e.Key, e.Revision)
					continue
				}
				x.carts[e.Key] = string(e.Snapshot.Payload)
				fmt.Fprintf(out, "index: %s %s at revision %d: %q\n", e.Kind, e.Key, e.Revision, e.Snapshot.Payload)
			}
		case authority.FeedProgress: // nothing changed up to batch.Revision
		}
		x.revision = batch.Revision // a real index saves it with the carts, in one write
	}
	return nil
}

// run starts embedded etcd, places carts and runs the cart index through a
// restart and a compaction, then reads through a view; it reports to out.
func run(ctx context.Context, out io.Writer) error {
	fmt.Fprintln(out, "A cart index follows the carts with a row feed: it lists them, stops, resumes after the revision\n"+
		"it saved, relists when etcd compacted that history away; then a view reads them from memory.")
	endpoint, stopEtcd, err := throwawayetcd.Start(ctx)
	if err != nil {
		return err
	}
	defer stopEtcd()
	fmt.Fprintf(out, "embedded etcd on %s\n", endpoint)
	// The program's own client: the store uses it, and so does the
	// compaction below (an operator's, or etcd's own, on your cluster).
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer func() { _ = client.Close() }() // last: after the store
	store, err := etcdstore.New(ctx, etcdstore.Config{Client: client, Namespace: namespace, RequestTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer func() { _ = store.Close() }() // after the lease, view and feeds
	lease, err := store.Registry().Acquire(ctx, node, 1, "owner-a", 10*time.Second)
	if err != nil {
		return err
	}
	defer func() { _ = lease.Close(context.WithoutCancel(ctx)) }() // revokes it: before the store closes
	c := &carts{store: store, lease: lease}

	index, err := c.indexRestarts(ctx, out, client)
	if err != nil {
		return err
	}
	if err := c.readThroughView(ctx, out); err != nil {
		return err
	}
	fmt.Fprintf(out, "the index holds %d carts; closing the owner lease, the store, then the client (the view and the feeds are closed)\n",
		len(index.carts))
	return nil
}

// indexRestarts runs the cart index three times, as a process that stops
// and restarts with what it saved: it lists, it resumes after its revision,
// and after a compaction it relists.
func (c *carts) indexRestarts(ctx context.Context, out io.Writer, client *clientv3.Client) (*cartIndex, error) {
	for _, id := range []string{"cart-1", "cart-2"} {
		if err := c.place(ctx, id); err != nil {
			return nil, err
		}
	}
	index := &cartIndex{}
	if err := c.catchUp(ctx, out, index); err != nil {
		return nil, err
	}
	saved := *index // stopped: what it saved
	fmt.Fprintf(out, "index stopped at revision %d; meanwhile cart-3 is placed and cart-1 removed\n", saved.revision)
	if err := c.place(ctx, "cart-3"); err != nil {
		return nil, err
	}
	if err := c.remove(ctx, "cart-1"); err != nil {
		return nil, err
	}
	index = &cartIndex{carts: maps.Clone(saved.carts), revision: saved.revision} // restarted
	if err := c.catchUp(ctx, out, index); err != nil {
		return nil, err
	}

	saved = *index
	if err := c.place(ctx, "cart-4"); err != nil {
		return nil, err
	}
	rev, err := c.store.FeedRevision(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := client.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "index stopped at revision %d; meanwhile cart-4 is placed and etcd compacts its history up to revision %d\n",
		saved.revision, rev)
	index = &cartIndex{carts: maps.Clone(saved.carts), revision: saved.revision} // restarted
	return index, c.catchUp(ctx, out, index)
}

// catchUp runs index until it applied every change made before the call.
func (c *carts) catchUp(ctx context.Context, out io.Writer, index *cartIndex) error {
	now, err := c.store.FeedRevision(ctx)
	if err != nil {
		return err
	}
	return index.follow(ctx, out, c.store, now)
}

// readThroughView starts a view of the carts and reads cart-4 from it
// consistently: before and after a write, which the second read sees.
func (c *carts) readThroughView(ctx context.Context, out io.Writer) error {
	v, err := view.New(ctx, c.store, view.Config{Prefix: cartPrefix})
	if err != nil {
		return err
	}
	defer func() { _ = v.Close() }() // first: before the lease and the store
	key, err := authority.EncodeKey(authority.ObjectUserSpot, "cart-4")
	if err != nil {
		return err
	}
	for i := range 2 {
		if i == 1 {
			if err := c.update(ctx, "cart-4", "cart-4, 3 items"); err != nil {
				return err
			}
			fmt.Fprintln(out, "cart-4 updated through the store")
		}
		read, err := v.Read(ctx, key, view.Freshness{}) // consistent: sees every write completed before it
		if err != nil {
			return err
		}
		if read.Kind != authority.KindSnapshot {
			return fmt.Errorf("view: %s is %s", key, read.Kind)
		}
		fmt.Fprintf(out, "view: %s is %q at revision %d (from memory: %v)\n",
			key, read.Snapshot.Payload, read.Revision, !read.FromStore)
	}
	return nil
}

// carts places, changes and removes the carts of node-a's owner.
type carts struct {
	store *etcdstore.Store
	lease *etcdstore.OwnerLease
}

// place creates the User Spot id on node-a: reserve, then commit.
func (c *carts) place(ctx context.Context, id string) error {
	request := []byte("create " + id)
	sum := sha256.Sum256(request)
	req := authority.ReserveRequest{
		Key: authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: id},
		Intent: authority.CreationIntent{
			StableType: "cart", RequestContentReference: "inline:" + id,
			RequestSHA256: sum[:], RequestEncodedSize: int64(len(request)),
		},
		Target: authority.CreationTarget{
			MeshName: node.MeshName, NodeRID: node.RID, NodeLifecycleGeneration: 1, Owner: c.lease.Token(),
		},
		CreatingPayload: []byte("creating"),
		Capacity: authority.CapacityVector{Spots: 1, SpotType: &authority.SpotTypeCapacity{
			ObjectKind: authority.ObjectUserSpot, StableType: "cart", Count: 1,
		}},
	}
	reserved, err := c.store.Reserve(ctx, req)
	if err != nil {
		return err
	}
	if reserved.Kind != authority.KindReserved {
		return fmt.Errorf("reserving %s: %s", id, reserved.Kind)
	}
	committed, err := c.store.Commit(ctx, authority.CommitRequest{
		Key: req.Key, ReservationID: reserved.ReservationID, ExpectedStoreVersion: reserved.Creating.StoreVersion,
		Target: req.Target, ReadyPayload: []byte(id + ", empty"),
	})
	if err != nil {
		return err
	}
	if committed.Kind != authority.KindCommitted {
		return fmt.Errorf("committing %s: %s", id, committed.Kind)
	}
	return nil
}

// update replaces cart id's payload, at the version it reads.
func (c *carts) update(ctx context.Context, id, payload string) error {
	return c.write(ctx, id, authority.Put([]byte(payload)), authority.KindStored)
}

// remove deletes cart id's row, at the version it reads.
func (c *carts) remove(ctx context.Context, id string) error {
	return c.write(ctx, id, authority.Delete(), authority.KindDeleted)
}

// write applies m to cart id at the version it reads, expecting want.
func (c *carts) write(ctx context.Context, id string, m authority.Mutation, want authority.ResultKind) error {
	key, err := authority.EncodeKey(authority.ObjectUserSpot, id)
	if err != nil {
		return err
	}
	read, err := c.store.ReadAuthority(ctx, key)
	if err != nil {
		return err
	}
	if read.Kind != authority.KindSnapshot {
		return fmt.Errorf("reading %s: %s", id, read.Kind)
	}
	res, err := c.store.CompareExchangeAuthority(ctx, key, read.Snapshot.StoreVersion, m)
	if err != nil {
		return err
	}
	if res.Kind != want {
		return fmt.Errorf("writing %s: %s", id, res.Kind)
	}
	return nil
}
