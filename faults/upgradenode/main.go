// Command upgradenode is one node of the rolling-upgrade fault test
// (faults/upgrade_test.go): a store with an owner lease that reserves,
// commits, compare-exchanges, deletes and moves its own rows through
// same-owner aggregates, rebinds the rows of its previous process, and
// reads every node's rows, reporting each acknowledged write as one JSON
// line on its standard output. It ends when its standard input closes.
//
// The test builds it from this tree and from the previous release's tree
// (with the tag prevrelease, copying this file in), so it uses only the API
// both have.
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// StableType is the stable type of every row (a User Spot) the nodes write.
const StableType = "upgrade.Spot"

// spotCapacity is what each row holds.
var spotCapacity = authority.CapacityVector{Spots: 1, SpotType: &authority.SpotTypeCapacity{ObjectKind: authority.ObjectUserSpot, StableType: StableType, Count: 1}}

// Line is one report; the test decodes the same shape.
type Line struct {
	Ev      string `json:"ev"` // ready, ack, corrupt, error, refused, rebind, stopped
	Op      string `json:"op,omitempty"`
	Key     string `json:"key,omitempty"`
	Ver     int64  `json:"ver,omitempty"`
	Token   int64  `json:"token,omitempty"`
	Prev    int64  `json:"prevToken,omitempty"`
	Gen     int64  `json:"gen,omitempty"`
	Payload string `json:"payload,omitempty"`
	Active  int    `json:"active,omitempty"` // the store version before and after the op, when the build knows it
	After   int    `json:"activeAfter,omitempty"`
	Moved   int64  `json:"moved,omitempty"`
	Removed int64  `json:"removed,omitempty"`
	Err     string `json:"err,omitempty"`
	Build   string `json:"build,omitempty"`
}

var (
	outMu sync.Mutex
	out   = json.NewEncoder(os.Stdout)
)

func emit(l Line) {
	outMu.Lock()
	defer outMu.Unlock()
	_ = out.Encode(l)
}

// limitPolicy admits Spots up to a per-node limit.
type limitPolicy int64

func (p limitPolicy) PlacementCapacityAvailable(_ authority.NodeDescriptor, req, reserved, active authority.CapacityVector) bool {
	return req.Spots+reserved.Spots+active.Spots <= int64(p)
}

type node struct {
	s     *etcdstore.Store
	lease *etcdstore.OwnerLease
	desc  authority.NodeDescriptor
	rng   *rand.Rand
	rows  map[authority.Key]*authority.Snapshot // this process's rows as last written, by key
	n     int
}

func main() {
	endpoints := flag.String("endpoints", "", "etcd endpoints")
	ns := flag.String("namespace", "", "namespace")
	id := flag.String("node", "", "node RID and owner ID")
	limit := flag.Int64("limit", 12, "Spots per node")
	flag.Parse()
	// a closed standard input stops the node after the operation in
	// flight, so that every write it made is reported
	ctx := context.Background()
	var stopping atomic.Bool
	go func() { _, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin)); stopping.Store(true) }()
	s, err := etcdstore.New(ctx, etcdstore.Config{Endpoints: strings.Split(*endpoints, ","), Namespace: *ns,
		RequestTimeout: 10 * time.Second, CapacityPolicy: limitPolicy(*limit)})
	if err != nil {
		emit(Line{Ev: "refused", Err: err.Error(), Build: build})
		os.Exit(3)
	}
	n := &node{s: s, desc: authority.NodeDescriptor{MeshName: "upgrade", RID: *id}, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7)),
		rows: map[authority.Key]*authority.Snapshot{}}
	if err := n.start(ctx, *id); err != nil {
		emit(Line{Ev: "error", Op: "start", Err: err.Error()})
		os.Exit(1)
	}
	for !stopping.Load() {
		n.step(ctx)
	}
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = n.lease.Close(cctx)
	_ = s.Close()
	emit(Line{Ev: "stopped"})
}

// start takes the next lease generation of the node's owner and moves the
// rows of the previous one onto it.
func (n *node) start(ctx context.Context, id string) error {
	l, err := n.s.Registry().Acquire(ctx, n.desc, 1, id, 3*time.Second)
	if err != nil {
		return err
	}
	n.lease = l
	gen := l.Token().LeaseGeneration
	if gen > 1 {
		prev := authority.OwnerToken{OwnerID: id, LeaseGeneration: gen - 1}
		moved, err := l.RebindRows(ctx, prev)
		if err != nil {
			return fmt.Errorf("rebind: %w", err)
		}
		removed, err := n.s.RemoveAllByOwner(ctx, prev)
		if err != nil {
			return fmt.Errorf("remove: %w", err)
		}
		emit(Line{Ev: "rebind", Gen: gen, Moved: moved, Removed: removed})
		n.adopt(ctx)
	}
	emit(Line{Ev: "ready", Gen: gen, Active: activeVersion(n.s), Build: build})
	return nil
}

// adopt reports every row of the node after a rebind, as this process now
// holds it.
func (n *node) adopt(ctx context.Context) {
	for _, it := range n.list(ctx, "user_spot/"+n.desc.RID+"-") {
		if s := it.Snapshot; s.Owner() == n.lease.Token() {
			n.rows[it.Key] = s
			emit(Line{Ev: "ack", Op: "rebound", Key: string(it.Key), Ver: parseVersion(s.StoreVersion), Token: s.OwnershipToken, Payload: string(s.Payload)})
		}
	}
}

func (n *node) step(ctx context.Context) {
	switch r := n.rng.IntN(100); {
	case r < 35:
		n.create(ctx)
	case r < 65:
		n.put(ctx)
	case r < 80:
		n.selfMove(ctx)
	case r < 90:
		n.remove(ctx)
	default:
		n.list(ctx, "user_spot/")
	}
}

// failed reports err unless it is nil; it says whether there was one.
func failed(op string, err error) bool { return failedOn(op, "", err) }

// failedOn is failed for an operation on key.
func failedOn(op string, key authority.Key, err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, authority.ErrCorrupt):
		emit(Line{Ev: "corrupt", Op: op, Key: string(key), Err: err.Error()})
	case errors.Is(err, context.Canceled):
	default:
		emit(Line{Ev: "error", Op: op, Key: string(key), Err: err.Error()})
	}
	return true
}

func (n *node) target() authority.CreationTarget {
	return authority.CreationTarget{MeshName: n.desc.MeshName, NodeRID: n.desc.RID, NodeLifecycleGeneration: 1, Owner: n.lease.Token()}
}

func (n *node) create(ctx context.Context) {
	n.n++
	gid := fmt.Sprintf("%s-g%d-%d", n.desc.RID, n.lease.Token().LeaseGeneration, n.n)
	ref := "content-" + gid
	sum := sha256.Sum256([]byte(ref))
	req := authority.ReserveRequest{Key: authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: gid},
		Intent: authority.CreationIntent{StableType: StableType, RequestContentReference: ref, RequestSHA256: sum[:], RequestEncodedSize: int64(len(ref))},
		Target: n.target(), CreatingPayload: []byte("creating"), Capacity: spotCapacity}
	res, err := n.s.Reserve(ctx, req)
	if failed("reserve", err) {
		return
	}
	if res.Kind == authority.KindPlacementCapacityExhausted {
		n.remove(ctx) // make room
		return
	}
	if res.Kind != authority.KindReserved {
		emit(Line{Ev: "error", Op: "reserve", Err: string(res.Kind)})
		return
	}
	payload := "ready-" + gid
	c, err := n.s.Commit(ctx, authority.CommitRequest{Key: req.Key, ReservationID: res.ReservationID,
		ExpectedStoreVersion: res.Creating.StoreVersion, Target: req.Target, ReadyPayload: []byte(payload)})
	if failed("commit", err) {
		return
	}
	if c.Kind != authority.KindCommitted {
		emit(Line{Ev: "error", Op: "commit", Err: string(c.Kind)})
		return
	}
	key, _ := req.Key.Encode()
	n.acked("create", key, c.Ready, 0, 0, 0)
}

func (n *node) acked(op string, key authority.Key, s *authority.Snapshot, prev int64, before, after int) {
	n.rows[key] = s
	emit(Line{Ev: "ack", Op: op, Key: string(key), Ver: parseVersion(s.StoreVersion), Token: s.OwnershipToken, Prev: prev,
		Payload: string(s.Payload), Active: before, After: after})
}

// pick returns one of the node's rows (nil: none).
func (n *node) pick() (authority.Key, *authority.Snapshot) {
	for k, s := range n.rows {
		return k, s
	}
	return "", nil
}

func (n *node) put(ctx context.Context) {
	key, s := n.pick()
	if s == nil {
		return
	}
	payload := fmt.Sprintf("put-%d", n.rng.Int64())
	res, err := n.s.CompareExchangeAuthority(ctx, key, s.StoreVersion, authority.Put([]byte(payload)))
	if failedOn("put", key, err) {
		return
	}
	if res.Kind != authority.KindStored {
		emit(Line{Ev: "error", Op: "put", Key: string(key), Err: string(res.Kind)})
		delete(n.rows, key)
		return
	}
	n.acked("put", key, res.Snapshot, s.OwnershipToken, 0, 0)
}

func (n *node) remove(ctx context.Context) {
	key, s := n.pick()
	if s == nil {
		return
	}
	res, err := n.s.CompareExchangeAuthority(ctx, key, s.StoreVersion, authority.Delete())
	if failedOn("delete", key, err) {
		return
	}
	delete(n.rows, key)
	if res.Kind != authority.KindDeleted {
		emit(Line{Ev: "error", Op: "delete", Key: string(key), Err: string(res.Kind)})
		return
	}
	emit(Line{Ev: "ack", Op: "delete", Key: string(key), Ver: parseVersion(res.StoreVersion)})
}

// selfMove moves a row to its own owner and node through an aggregate (a
// new-owner transition that keeps the owner).
func (n *node) selfMove(ctx context.Context) {
	key, s := n.pick()
	if s == nil {
		return
	}
	n.n++
	before := activeVersion(n.s)
	payload := fmt.Sprintf("moved-%d", n.n)
	req := authority.AggregatePrepareRequest{AggregateID: fmt.Sprintf("self-%s-%d-%d", n.desc.RID, n.lease.Token().LeaseGeneration, n.n),
		AggregateGeneration: 1, TargetOwner: n.lease.Token(), TargetDescriptor: n.desc, TargetDescriptorLifecycleGeneration: 1,
		Capacity: spotCapacity, InventoryDigest: make([]byte, 32),
		Participants: []authority.AggregateParticipant{{AuthorityKey: key, ExpectedStoreVersion: s.StoreVersion,
			OwnerTransition: authority.TransitionNewOwner, AuthorityPayload: []byte(payload)}}}
	p, err := n.s.PrepareAggregate(ctx, req)
	if failedOn("prepare", key, err) {
		return
	}
	switch p.Kind {
	case authority.KindPrepared:
	case authority.KindPlacementCapacityExhausted:
		n.remove(ctx) // the move takes a second slot until it commits
		return
	default:
		// under a capacity policy a prepare that does not fit is a
		// conflict too: the row unchanged says so
		r, err := n.s.ReadAuthority(ctx, key)
		if failedOn("read", key, err) {
			return
		}
		if r.Snapshot != nil && r.Snapshot.StoreVersion == s.StoreVersion {
			n.remove(ctx)
			return
		}
		emit(Line{Ev: "error", Op: "prepare", Key: string(key), Err: string(p.Kind)})
		delete(n.rows, key)
		return
	}
	c, err := n.s.CommitAggregate(ctx, p.Fence)
	if failedOn("commit-aggregate", key, err) || c.Kind != authority.KindCommitted {
		return
	}
	r, err := n.s.ReadAuthority(ctx, key)
	if failedOn("read", key, err) || r.Kind != authority.KindSnapshot {
		return
	}
	n.acked("selfagg", key, r.Snapshot, s.OwnershipToken, before, activeVersion(n.s))
}

// list reads every row under prefix, page by page.
func (n *node) list(ctx context.Context, prefix string) []authority.ScanItem {
	var all []authority.ScanItem
	var cursor authority.ScanCursor
	for {
		page, err := n.s.ListAuthorities(ctx, prefix, cursor, 100)
		if failed("list", err) {
			return all
		}
		all = append(all, page.Items...)
		if page.NextCursor == "" {
			return all
		}
		cursor = page.NextCursor
	}
}

// parseVersion returns an etcd StoreVersion's revision (0 if it is none).
func parseVersion(v authority.StoreVersion) int64 {
	n, _ := strconv.ParseInt(string(v), 10, 64)
	return n
}
