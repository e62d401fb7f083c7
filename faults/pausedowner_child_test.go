package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// The paused owner runs in a child process: the test binary re-executed
// with envPausedOwner holding its configuration (as etcdcluster runs its
// members). It reports on its standard output, one JSON line each; its
// standard input closing ends it.

// envPausedOwner names the environment variable that makes the test binary
// run a paused-owner child instead of its tests.
const envPausedOwner = "FAULTS_PAUSED_OWNER"

// pausedOwnerConfig is what the test tells the owner process.
type pausedOwnerConfig struct {
	Endpoints []string      `json:"endpoints"`
	Namespace string        `json:"namespace"`
	Tag       string        `json:"tag"`
	TTL       time.Duration `json:"ttl"`
}

// pausedOwnerLine is one line the owner process writes: its rows once they
// are placed ("ready"), or one write it tried ("write").
type pausedOwnerLine struct {
	Event string `json:"event"`
	// ready
	OwnerID    string   `json:"ownerID,omitempty"`
	Generation int64    `json:"generation,omitempty"`
	Keep       string   `json:"keep,omitempty"`     // active row nobody moves in rebind mode
	Moved      []string `json:"moved,omitempty"`    // active rows the replacement takes over
	Reserved   string   `json:"reserved,omitempty"` // its pending reservation
	// write
	Seq     int    `json:"seq,omitempty"`
	Op      string `json:"op,omitempty"`
	Start   int64  `json:"start,omitempty"` // wall clock, Unix ns (one machine)
	Result  string `json:"result,omitempty"`
	Applied bool   `json:"applied,omitempty"`
}

// pausedOwnerMarker starts the payload of every write the owner of tag
// tries in its write loop.
func pausedOwnerMarker(tag string) string { return "paused-" + tag + "-w" }

// runPausedOwnerIfRequested runs the paused-owner child and exits when the
// process was started as one; otherwise it returns at once.
func runPausedOwnerIfRequested() {
	runChildIfRequested(envPausedOwner, "paused owner", runPausedOwner)
}

// childRetry retries fn until it returns nil or a non-transient error, for
// up to settleTimeout.
func childRetry(fn func(ctx context.Context) error) error {
	deadline := time.Now().Add(settleTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		err := fn(ctx)
		cancel()
		if err == nil || !transient(err) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(retryPause)
	}
}

// pausedOwner is the owner's state in the child.
type pausedOwner struct {
	st       *etcdstore.Store
	tgt      authority.CreationTarget
	versions map[string]authority.StoreVersion // global ID → last version it wrote
	pending  reservation
	out      *json.Encoder
	seq      int
	marker   string
}

// runPausedOwner acquires a lease, places the owner's rows, reports them,
// then writes until it is ended, never looking at its lease's Done.
func runPausedOwner(cfg pausedOwnerConfig) error {
	ownerID := "paused-owner-" + cfg.Tag
	st, lease, err := childOwner(cfg.Endpoints, cfg.Namespace, ownerID, conformance.NodeA, cfg.TTL)
	if err != nil {
		return err
	}
	o := &pausedOwner{st: st, tgt: conformance.Target(conformance.NodeA, conformance.NodeLifecycle, lease.Token()),
		versions: map[string]authority.StoreVersion{}, out: json.NewEncoder(os.Stdout), marker: pausedOwnerMarker(cfg.Tag)}
	ready := pausedOwnerLine{Event: "ready", OwnerID: ownerID, Generation: lease.Token().LeaseGeneration}
	ready.Keep = "po-" + cfg.Tag + "-keep"
	ready.Moved = []string{"po-" + cfg.Tag + "-a0", "po-" + cfg.Tag + "-a1"}
	ready.Reserved = "po-" + cfg.Tag + "-pending"
	for _, id := range append([]string{ready.Keep}, ready.Moved...) {
		if err := o.place(id); err != nil {
			return err
		}
	}
	if err := childRetry(func(ctx context.Context) error {
		req := reserveRequest(authority.ObjectUserSpot, ready.Reserved, o.tgt, ready.Reserved+"-creating")
		res, err := st.Reserve(ctx, req)
		if err == nil && res.Kind != authority.KindReserved {
			return fmt.Errorf("reserve %s: %s", ready.Reserved, res.Kind)
		}
		if err == nil {
			o.pending = reservation{req: req, id: res.ReservationID, row: res.Creating}
		}
		return err
	}); err != nil {
		return err
	}
	if err := o.out.Encode(ready); err != nil {
		return err
	}
	for {
		o.writeOnce(append([]string{ready.Keep}, ready.Moved...))
		time.Sleep(20 * time.Millisecond)
	}
}

// childOwner connects a child process to the cluster at endpoints and
// acquires an owner lease of ownerID on node through a store on namespace.
func childOwner(endpoints []string, namespace, ownerID string, node authority.NodeDescriptor, ttl time.Duration) (*etcdstore.Store, *etcdstore.OwnerLease, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	st, err := etcdstore.New(ctx, etcdstore.Config{Client: cli, Namespace: namespace, RequestTimeout: requestTimeout, SkipVersionCheck: true})
	if err != nil {
		return nil, nil, err
	}
	var lease *etcdstore.OwnerLease
	if err := childRetry(func(ctx context.Context) error {
		lease, err = st.Registry().Acquire(ctx, node, conformance.NodeLifecycle, ownerID, ttl)
		return err
	}); err != nil {
		return nil, nil, fmt.Errorf("acquire: %w", err)
	}
	return st, lease, nil
}

// place reserves and commits the active row id.
func (o *pausedOwner) place(id string) error {
	ready, err := placeActive(o.st, o.tgt, id)
	if err == nil {
		o.versions[id] = ready.StoreVersion
	}
	return err
}

// placeActive reserves and commits the active User Spot id on tgt (in a
// child process: retrying transient errors) and returns the Ready row.
func placeActive(st *etcdstore.Store, tgt authority.CreationTarget, id string) (*authority.Snapshot, error) {
	return placeWithPayload(st, tgt, id, []byte(id+"-ready"))
}

// placeWithPayload is placeActive with the Ready payload given.
func placeWithPayload(st *etcdstore.Store, tgt authority.CreationTarget, id string, payload []byte) (*authority.Snapshot, error) {
	req := reserveRequest(authority.ObjectUserSpot, id, tgt, id+"-creating")
	var r reservation
	if err := childRetry(func(ctx context.Context) error {
		res, err := st.Reserve(ctx, req)
		if err == nil && res.Kind != authority.KindReserved {
			return fmt.Errorf("reserve %s: %s", id, res.Kind)
		}
		if err == nil {
			r = reservation{req: req, id: res.ReservationID, row: res.Creating}
		}
		return err
	}); err != nil {
		return nil, err
	}
	var ready *authority.Snapshot
	err := childRetry(func(ctx context.Context) error {
		c := r.commit("")
		c.ReadyPayload = payload
		res, err := st.Commit(ctx, c)
		if err == nil && res.Kind != authority.KindCommitted {
			return fmt.Errorf("commit %s: %s", id, res.Kind)
		}
		if err == nil {
			ready = res.Ready
		}
		return err
	})
	return ready, err
}

// writeOnce tries the next of the owner's writes, each with what it knows
// (the versions it wrote last, its reservation, its own target), and
// reports it. The four kinds take turns: a put on each active row, a commit
// of its reservation and a new reservation.
func (o *pausedOwner) writeOnce(rows []string) {
	o.seq++
	payload := fmt.Sprintf("%s%d", o.marker, o.seq)
	line := pausedOwnerLine{Event: "write", Seq: o.seq, Start: time.Now().UnixNano()}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	var kind authority.ResultKind
	var err error
	switch n := o.seq % (len(rows) + 2); {
	case n < len(rows):
		id := rows[n]
		line.Op = "put " + id
		var res authority.CompareExchangeResult
		key, _ := authority.EncodeKey(authority.ObjectUserSpot, id)
		res, err = o.st.CompareExchangeAuthority(ctx, key, o.versions[id], authority.Put([]byte(payload)))
		kind = res.Kind
		if err == nil && res.Kind == authority.KindStored {
			o.versions[id] = res.Snapshot.StoreVersion
		}
	case n == len(rows):
		line.Op = "commit " + o.pending.req.Key.GlobalID
		var res authority.CommitResult
		res, err = o.st.Commit(ctx, o.pending.commit(payload))
		kind = res.Kind
	default:
		line.Op = "reserve " + payload
		var res authority.ReserveResult
		res, err = o.st.Reserve(ctx, reserveRequest(authority.ObjectUserSpot, payload, o.tgt, payload))
		kind = res.Kind
	}
	line.Result = string(kind)
	if err != nil {
		line.Result = "error: " + err.Error()
	}
	switch kind {
	case authority.KindStored, authority.KindCommitted, authority.KindReserved:
		line.Applied = true
	}
	_ = o.out.Encode(line)
}

// pausedOwnerProc is the test's handle on an owner process: its lines are
// its writes.
type pausedOwnerProc struct {
	*lineChild[pausedOwnerLine]
}

// startPausedOwner starts an owner process and waits until its rows are
// placed. t's cleanup kills it.
func startPausedOwner(t *testing.T, cfg pausedOwnerConfig) *pausedOwnerProc {
	t.Helper()
	return &pausedOwnerProc{startLineChild(t, envPausedOwner, cfg, func(l pausedOwnerLine) bool { return l.Event == "ready" })}
}

// waitWrites waits until the owner reported n writes.
func (p *pausedOwnerProc) waitWrites(t *testing.T, n int) { p.waitWritesAfter(t, time.Time{}, n) }

// waitWritesAfter waits until the owner reported n writes it started after
// from, and returns them.
func (p *pausedOwnerProc) waitWritesAfter(t *testing.T, from time.Time, n int) []pausedOwnerLine {
	t.Helper()
	var after []pausedOwnerLine
	p.waitFor(t, fmt.Sprintf("%d writes after %v", n, from), func(ws []pausedOwnerLine) bool {
		after = after[:0]
		for _, w := range ws {
			if w.Start > from.UnixNano() {
				after = append(after, w)
			}
		}
		return len(after) >= n
	})
	return after
}
