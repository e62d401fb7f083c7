// Command fencing shows an owner fencing the writes it makes to its own
// PostgreSQL database with the store's ownership token, so that once the
// object has a new owner, the old owner's writes are refused — whenever it
// wakes up.
//
//	go run ./examples/fencing -dsn 'host=/var/run/postgresql dbname=app'
//	go run ./examples/fencing -dsn '…' -endpoints 127.0.0.1:2379   # your etcd instead of a throwaway one
//
// An owner on node-a creates the User Spot "account-7" and saves its
// balance through fencing.Guard with the Spot's token. Then the owner's
// lease is taken over by a new lease generation (as after the process
// stalled past its lease TTL: RebindRows), which saves a new balance with
// the new, higher token. The old owner's late write is refused with
// fencing.ErrStaleToken, and the balance stays the new owner's.
//
// The guard is bound to the etcd cluster (Store.ClusterID): tokens only rise
// within one cluster. Without -endpoints every run starts a new throwaway
// cluster, whose tokens start low again; the program then adopts it
// (Guard.Adopt: the earlier run's cluster is gone, and its writers would
// stay refused), so it runs any number of times on one database. With
// -endpoints it never adopts: a fence table that follows another cluster is
// an operator's decision (docs/operations.md). Its test runs it twice on one
// database; CI runs the test.
package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"github.com/zlink-systems/authority/examples/throwawayetcd"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/fencing"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// fenceTable is the example's own fence table: adopting a throwaway cluster
// there never touches the fence of your application (DefaultTable).
const fenceTable = "authority_fence_example"

// node is where the owner runs.
var node = authority.NodeDescriptor{MeshName: "mesh", RID: "node-a"}

func main() {
	dsn := flag.String("dsn", "", "PostgreSQL connection string (required)")
	endpoints := flag.String("endpoints", "", "etcd endpoints, comma-separated (empty: a throwaway embedded server)")
	flag.Parse()
	if *dsn == "" {
		fmt.Fprintln(os.Stderr, "usage: fencing -dsn POSTGRESQL-DSN [-endpoints host:port,...]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var eps []string
	if *endpoints != "" {
		eps = strings.Split(*endpoints, ",")
	}
	if err := run(ctx, os.Stdout, *dsn, eps); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		stop()
		os.Exit(1)
	}
}

// run connects to PostgreSQL at dsn and to etcd at endpoints (none: a
// throwaway server) and plays the owner, its takeover and its late write,
// reporting to out.
func run(ctx context.Context, out io.Writer, dsn string, endpoints []string) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	throwaway := len(endpoints) == 0
	if throwaway {
		endpoint, stopEtcd, err := throwawayetcd.Start(ctx)
		if err != nil {
			return err
		}
		defer stopEtcd()
		endpoints = []string{endpoint}
	}
	store, err := etcdstore.New(ctx, etcdstore.Config{Endpoints: endpoints,
		Namespace: fmt.Sprintf("/fencing-example/%d/", time.Now().UnixNano())}) // a fresh namespace each run
	if err != nil {
		return err
	}
	defer store.Close()
	guard, err := setUpDatabase(ctx, out, db, store, throwaway)
	if err != nil {
		return err
	}
	return play(ctx, out, store, db, guard)
}

// setUpDatabase creates the fence table and the application's table, and
// returns the guard bound to the store's cluster. newCluster says the
// cluster was started by this run: a table that follows another cluster
// follows an earlier run's, which is gone, and adopts this one.
func setUpDatabase(ctx context.Context, out io.Writer, db *sql.DB, store *etcdstore.Store, newCluster bool) (*fencing.Guard, error) {
	guard, err := fencing.NewGuard(fencing.PostgreSQL, fenceTable)
	if err != nil {
		return nil, err
	}
	if err := guard.Init(ctx, db); err != nil { // or run guard.Schema() in a migration
		return nil, err
	}
	if _, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS balances (account text PRIMARY KEY, balance bigint NOT NULL)`); err != nil {
		return nil, err
	}
	cluster, err := store.ClusterID(ctx)
	if err != nil {
		return nil, err
	}
	follows, err := guard.Cluster(ctx, db)
	if err != nil {
		return nil, err
	}
	if newCluster && follows != "" && follows != cluster {
		dropped, err := guard.Adopt(ctx, db, cluster)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(out, "the fence table followed etcd cluster %s (an earlier run's, gone); adopted this run's cluster %s, dropping %d tokens\n",
			follows, cluster, dropped)
	}
	return guard.ForCluster(cluster)
}

// play runs the owner, the takeover and the late write.
func play(ctx context.Context, out io.Writer, store *etcdstore.Store, db *sql.DB, guard *fencing.Guard) error {
	first, err := store.Registry().Acquire(ctx, node, 1, "owner-a", 10*time.Second)
	if err != nil {
		return err
	}
	defer first.Close(context.Background())
	spot, err := create(ctx, store, first.Token(), "account-7")
	if err != nil {
		return err
	}
	encoded, err := authority.EncodeKey(authority.ObjectUserSpot, "account-7")
	if err != nil {
		return err
	}
	key := string(encoded) // the object the fence names: its authority key
	oldToken := fencing.TokenOf(spot)
	if err := saveBalance(ctx, db, guard, key, oldToken, "account-7", 100); err != nil {
		return err
	}
	fmt.Fprintf(out, "owner-a@%d (token %d) saved balance 100\n", first.Token().LeaseGeneration, oldToken)

	// owner-a stalls past its lease; a new generation takes its rows over
	next, err := store.Registry().Acquire(ctx, node, 1, "owner-a", 10*time.Second)
	if err != nil {
		return err
	}
	defer next.Close(context.Background())
	if _, err := next.RebindRows(ctx, first.Token()); err != nil {
		return err
	}
	read, err := store.ReadAuthority(ctx, authority.Key(key))
	if err != nil || read.Kind != authority.KindSnapshot {
		return fmt.Errorf("read %s: %v %v", key, read.Kind, err)
	}
	newToken := fencing.TokenOf(read.Snapshot)
	if err := saveBalance(ctx, db, guard, key, newToken, "account-7", 250); err != nil {
		return err
	}
	fmt.Fprintf(out, "owner-a@%d (token %d) took account-7 over and saved balance 250\n", next.Token().LeaseGeneration, newToken)

	// the stalled generation wakes up and writes as if nothing happened
	err = saveBalance(ctx, db, guard, key, oldToken, "account-7", 999)
	if !errors.Is(err, fencing.ErrStaleToken) {
		return fmt.Errorf("the stale write was not refused: %v", err)
	}
	fmt.Fprintf(out, "refused the late write of owner-a@%d: %v\n", first.Token().LeaseGeneration, err)
	var balance int64
	if err := db.QueryRowContext(ctx, `SELECT balance FROM balances WHERE account = $1`, "account-7").Scan(&balance); err != nil {
		return err
	}
	fmt.Fprintf(out, "balance of account-7: %d\n", balance)
	return nil
}

// create reserves and commits the User Spot id for owner on node and
// returns the Ready row.
func create(ctx context.Context, store *etcdstore.Store, owner authority.OwnerToken, id string) (*authority.Snapshot, error) {
	ref := "inline:" + id
	sum := sha256.Sum256([]byte(ref))
	target := authority.CreationTarget{MeshName: node.MeshName, NodeRID: node.RID, NodeLifecycleGeneration: 1, Owner: owner}
	reserved, err := store.Reserve(ctx, authority.ReserveRequest{
		Key:    authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: id},
		Intent: authority.CreationIntent{StableType: "bank.Account", RequestContentReference: ref, RequestSHA256: sum[:], RequestEncodedSize: int64(len(ref))},
		Target: target, CreatingPayload: []byte("creating"),
		Capacity: authority.CapacityVector{Spots: 1, SpotType: &authority.SpotTypeCapacity{ObjectKind: authority.ObjectUserSpot, StableType: "bank.Account", Count: 1}},
	})
	if err != nil || reserved.Kind != authority.KindReserved {
		return nil, fmt.Errorf("reserve %s: %v %v", id, reserved.Kind, err)
	}
	committed, err := store.Commit(ctx, authority.CommitRequest{Key: authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: id},
		ReservationID: reserved.ReservationID, ExpectedStoreVersion: reserved.Creating.StoreVersion, Target: target, ReadyPayload: []byte("ready")})
	if err != nil || committed.Kind != authority.KindCommitted {
		return nil, fmt.Errorf("commit %s: %v %v", id, committed.Kind, err)
	}
	return committed.Ready, nil
}

// README:begin
// saveBalance is one effect of the owner of object: its write of account's
// balance, fenced with the token its ownership came with.
func saveBalance(ctx context.Context, db *sql.DB, guard *fencing.Guard,
	object string, token fencing.Token, account string, balance int64) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // a no-op after Commit
	if err := guard.Check(ctx, tx, object, token); err != nil {
		// errors.Is(err, fencing.ErrStaleToken): object has a newer owner;
		// tx is already rolled back. Stop working on object.
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO balances (account, balance) VALUES ($1, $2)
		ON CONFLICT (account) DO UPDATE SET balance = EXCLUDED.balance`, account, balance); err != nil {
		return err
	}
	return tx.Commit()
}

// README:end
