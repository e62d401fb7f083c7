package faults_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/sharded"
	"github.com/zlink-systems/authority/provider/sharded/reshard"
)

// The processes of TestReshardUnderWriters: nodes writing rows through a
// sharded store while the map grows, and the resharding job, each in a
// process of its own so that it can be killed.

const (
	envReshardNode  = "AUTHORITY_FAULTS_RESHARD_NODE"
	envReshardMover = "AUTHORITY_FAULTS_RESHARD_MOVER"
)

// reshardCluster is one cluster of the test: its endpoints and the
// namespace the store uses there.
type reshardCluster struct {
	Endpoints []string
	Namespace string
}

func (c reshardCluster) config() etcdstore.Config {
	return etcdstore.Config{Endpoints: c.Endpoints, Namespace: c.Namespace, RequestTimeout: 5 * time.Second, DialTimeout: 2 * time.Second}
}

func configs(cs []reshardCluster) []etcdstore.Config {
	out := make([]etcdstore.Config, len(cs))
	for i, c := range cs {
		out[i] = c.config()
	}
	return out
}

// reshardNodeConfig configures a node: its index, the clusters (the first
// Shards are the map in force, the rest spares) and how many rows it
// creates before it reports ready.
type reshardNodeConfig struct {
	Node     int
	Clusters []reshardCluster
	Shards   int
	Fill     int
}

// reshardNodeLine is one line a node writes: ready, trying (a write about
// to be sent), acked (a write acknowledged and read back through the
// node's second store), stale (a read back that did not see it), or failed.
type reshardNodeLine struct {
	Event     string `json:"event"`
	Key       string `json:"key,omitempty"`
	Payload   string `json:"payload,omitempty"`
	RefusedMs int64  `json:"refusedMs,omitempty"`
	Refused   int64  `json:"refused,omitempty"`
	Err       string `json:"err,omitempty"`
}

func runReshardNodeIfRequested() { runChildIfRequested(envReshardNode, "reshard node", runReshardNode) }

// reshardNode is a running node: a store it writes through, another it
// reads back through (each follows the map on its own), its owner lease.
type reshardNode struct {
	cfg          reshardNodeConfig
	write, check *sharded.Store
	target       authority.CreationTarget
	mu           sync.Mutex
	out          *json.Encoder
	mine         []authority.Key
	refused      int64
}

func runReshardNode(cfg reshardNodeConfig) error {
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	open := func() (*sharded.Store, error) {
		cs := configs(cfg.Clusters)
		return sharded.New(ctx, sharded.Config{Shards: cs[:cfg.Shards], Spares: cs[cfg.Shards:], Epoch: int64(cfg.Shards)})
	}
	n := &reshardNode{cfg: cfg, out: json.NewEncoder(os.Stdout)}
	var err error
	if n.write, err = open(); err != nil {
		return err
	}
	if n.check, err = open(); err != nil {
		return err
	}
	node := authority.NodeDescriptor{MeshName: "mesh", RID: fmt.Sprintf("node-%d", cfg.Node)}
	lease, err := n.write.Registry().Acquire(ctx, node, 1, fmt.Sprintf("owner-%d", cfg.Node), 3*time.Second)
	if err != nil {
		return fmt.Errorf("acquire: %w", err)
	}
	n.target = conformance.Target(node, 1, lease.Token())
	for i := range cfg.Fill {
		if err := n.create(fmt.Sprintf("n%d-fill-%d", cfg.Node, i)); err != nil {
			return err
		}
	}
	n.emit(reshardNodeLine{Event: "ready"})
	for seq := 0; ; seq++ {
		var err error
		if seq%3 == 0 {
			err = n.create(fmt.Sprintf("n%d-%d", cfg.Node, seq))
		} else {
			err = n.rewrite(n.mine[rand.IntN(len(n.mine))], fmt.Sprintf("n%d-%d", cfg.Node, seq))
		}
		if err != nil {
			n.emit(reshardNodeLine{Event: "failed", Err: err.Error()})
			return err
		}
		select {
		case <-lease.Done():
			return errors.New("the owner lease ended")
		default:
		}
	}
}

func (n *reshardNode) emit(l reshardNodeLine) {
	n.mu.Lock()
	defer n.mu.Unlock()
	_ = n.out.Encode(l)
}

// retried runs op until it is neither refused for a move (ErrMoving) nor
// unavailable, and returns how long it was refused for.
func (n *reshardNode) retried(op func(ctx context.Context) error) (time.Duration, error) {
	var first time.Time
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := op(ctx)
		cancel()
		refused := errors.Is(err, sharded.ErrMoving)
		if err == nil || !refused && !errors.Is(err, authority.ErrUnavailable) || errors.Is(err, authority.ErrOutcomeUnknown) || attempt > 2000 {
			var waited time.Duration
			if !first.IsZero() {
				waited = time.Since(first)
			}
			return waited, err
		}
		if refused {
			n.refused++
			if first.IsZero() {
				first = time.Now()
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// create reserves and commits user spot id.
func (n *reshardNode) create(id string) error {
	sum := sha256.Sum256([]byte(id))
	req := authority.ReserveRequest{Key: authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: id},
		Intent: authority.CreationIntent{StableType: conformance.DefaultStableType, RequestContentReference: "ref-" + id,
			RequestSHA256: sum[:], RequestEncodedSize: int64(len(id))},
		Target: n.target, CreatingPayload: []byte("creating " + id),
		Capacity: conformance.Capacity(authority.ObjectUserSpot, conformance.DefaultStableType)}
	key, _ := req.Key.Encode()
	payload := "created " + id
	n.emit(reshardNodeLine{Event: "trying", Key: string(key), Payload: payload})
	var res authority.ReserveResult
	w1, err := n.retried(func(ctx context.Context) (err error) {
		res, err = n.write.Reserve(ctx, req)
		return err
	})
	if err != nil || res.Kind != authority.KindReserved {
		return fmt.Errorf("reserve %s: %v %v", id, res.Kind, err)
	}
	commit := authority.CommitRequest{Key: req.Key, ReservationID: res.ReservationID, ExpectedStoreVersion: res.Creating.StoreVersion,
		Target: n.target, ReadyPayload: []byte(payload)}
	var done authority.CommitResult
	w2, err := n.retried(func(ctx context.Context) (err error) {
		done, err = n.write.Commit(ctx, commit)
		return err
	})
	if err != nil || done.Kind != authority.KindCommitted && done.Kind != authority.KindAlreadyCommitted {
		return fmt.Errorf("commit %s: %v %v", id, done.Kind, err)
	}
	n.mine = append(n.mine, key)
	return n.acked(key, payload, max(w1, w2))
}

// rewrite puts payload into key with the version it reads.
func (n *reshardNode) rewrite(key authority.Key, payload string) error {
	n.emit(reshardNodeLine{Event: "trying", Key: string(key), Payload: payload})
	var res authority.CompareExchangeResult
	waited, err := n.retried(func(ctx context.Context) error {
		read, err := n.write.ReadAuthority(ctx, key)
		if err != nil {
			return err
		}
		if read.Kind != authority.KindSnapshot {
			return fmt.Errorf("row %s is %s", key, read.Kind)
		}
		res, err = n.write.CompareExchangeAuthority(ctx, key, read.Snapshot.StoreVersion, authority.Put([]byte(payload)))
		return err
	})
	if err != nil || res.Kind != authority.KindStored {
		return fmt.Errorf("rewrite %s: %v %v", key, res.Kind, err)
	}
	return n.acked(key, payload, waited)
}

// acked reports a write acknowledged, once the node's other store reads it.
func (n *reshardNode) acked(key authority.Key, payload string, waited time.Duration) error {
	var read authority.ReadResult
	if _, err := n.retried(func(ctx context.Context) (err error) {
		read, err = n.check.ReadAuthority(ctx, key)
		return err
	}); err != nil {
		return fmt.Errorf("read back %s: %w", key, err)
	}
	if read.Kind != authority.KindSnapshot || string(read.Snapshot.Payload) != payload {
		n.emit(reshardNodeLine{Event: "stale", Key: string(key), Payload: payload})
	}
	n.emit(reshardNodeLine{Event: "acked", Key: string(key), Payload: payload, RefusedMs: waited.Milliseconds(), Refused: n.refused})
	return nil
}

// reshardMoverConfig configures a mover: the clusters of the map in force
// and the one to add; it stops (and waits to be killed) before the step
// BlockAt the BlockCount-th time.
type reshardMoverConfig struct {
	Shards     []reshardCluster
	Add        reshardCluster
	BlockAt    string
	BlockCount int
	ClaimTTL   time.Duration
}

// reshardMoverLine is a step the mover reached, or blocked at.
type reshardMoverLine struct {
	Step    string `json:"step"`
	Blocked bool   `json:"blocked,omitempty"`
}

func runReshardMoverIfRequested() {
	runChildIfRequested(envReshardMover, "reshard mover", runReshardMover)
}

func runReshardMover(cfg reshardMoverConfig) error {
	out := json.NewEncoder(os.Stdout)
	seen := 0
	rc := reshard.Config{Shards: configs(cfg.Shards), Add: cfg.Add.config(), ClaimTTL: cfg.ClaimTTL, Mover: "faults-mover",
		LeaseWait: 20 * time.Second, AggregateWait: time.Second, Step: func(step string) {
			blocked := false
			if len(step) >= len(cfg.BlockAt) && step[:len(cfg.BlockAt)] == cfg.BlockAt {
				seen++
				blocked = seen == cfg.BlockCount
			}
			_ = out.Encode(reshardMoverLine{Step: step, Blocked: blocked})
			if blocked {
				select {} // killed here
			}
		}}
	_, err := reshard.Run(context.Background(), rc)
	return err
}
