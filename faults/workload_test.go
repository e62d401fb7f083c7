package faults_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	lin "github.com/zlink-systems/authority/internal/testkit/linearizability"
)

// rowKnowledge is what a client last saw of a key: the row as the model
// names it, the store version that row had, and the last reservation ID seen.
type rowKnowledge struct {
	row     lin.Row
	version authority.StoreVersion
	resID   string
}

// modelRow translates a provider snapshot into the model's row: its payload
// names its version.
func modelRow(s *authority.Snapshot) lin.Row {
	if s == nil {
		return lin.Row{}
	}
	r := lin.Row{State: lin.Active, Payload: string(s.Payload)}
	if s.Allocation.State == authority.AllocationReserved {
		r.State = lin.Reserved
		if s.PendingCreation != nil {
			r.ReservationID = s.PendingCreation.ReservationID
		}
	}
	return r
}

func (k *rowKnowledge) saw(s *authority.Snapshot) {
	if s == nil {
		*k = rowKnowledge{resID: k.resID}
		return
	}
	k.row, k.version = modelRow(s), s.StoreVersion
	if k.row.ReservationID != "" {
		k.resID = k.row.ReservationID
	}
}

func (k *rowKnowledge) sawRead(r authority.ReadResult) {
	if r.Kind == authority.KindSnapshot {
		k.saw(r.Snapshot)
		return
	}
	k.saw(nil)
}

// rowOutput is the model output of a result carrying a row read.
func rowOutput(kind authority.ResultKind, r authority.ReadResult) lin.Output {
	out := lin.Output{Kind: kind}
	if r.Kind == authority.KindSnapshot {
		out.Row = modelRow(r.Snapshot)
	}
	return out
}

// workerStats counts one client's operations.
type workerStats struct {
	ops, writesAcked atomic.Int64
}

// linClient is one client of the linearizability workload: its own etcd
// client and store (an etcd store, or a sharded one), one operation at a
// time.
type linClient struct {
	id int
	st authority.Store
	// reader answers the client's reads (nil: st).
	reader interface {
		ReadAuthority(ctx context.Context, key authority.Key) (authority.ReadResult, error)
	}
	tgt   authority.CreationTarget
	keys  []string // global IDs of user_spot rows
	rec   *recorder
	rng   *rand.Rand
	last  map[string]*rowKnowledge
	seq   int
	stats *workerStats
}

// run issues operations until ctx ends.
func (c *linClient) run(ctx context.Context) {
	for ctx.Err() == nil {
		c.step(ctx)
	}
}

// step issues one random operation on a random key and records it.
func (c *linClient) step(parent context.Context) {
	id := c.keys[c.rng.IntN(len(c.keys))]
	key := authority.Key("user_spot/" + id)
	kn := c.last[id]
	if kn == nil {
		kn = &rowKnowledge{}
		c.last[id] = kn
	}
	c.seq++
	payload := fmt.Sprintf("c%d-%d", c.id, c.seq) // unique in the run
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), opTimeout)
	defer cancel()
	c.stats.ops.Add(1)

	p := c.rng.IntN(20)
	if (p >= 15) && kn.resID == "" {
		p = 0 // commit/abort need a reservation ID: read instead
	}
	switch {
	case p < 6: // read
		op := c.rec.call(c.id, lin.Input{Op: lin.OpRead, Key: id})
		var res authority.ReadResult
		var err error
		if c.reader != nil {
			res, err = c.reader.ReadAuthority(ctx, key)
		} else {
			res, err = c.st.ReadAuthority(ctx, key)
		}
		if err != nil {
			c.rec.discard(op) // a read changes nothing
			return
		}
		c.rec.ret(op, rowOutput(res.Kind, res))
		kn.sawRead(res)
	case p < 11: // CAS put
		op := c.rec.call(c.id, lin.Input{Op: lin.OpPut, Key: id, Expected: kn.row.Payload, Payload: payload})
		res, err := c.st.CompareExchangeAuthority(ctx, key, kn.version, authority.Put([]byte(payload)))
		if c.failed(op, err) {
			return
		}
		switch res.Kind {
		case authority.KindStored:
			c.rec.ret(op, lin.Output{Kind: res.Kind, Row: modelRow(res.Snapshot)})
			kn.saw(res.Snapshot)
			c.stats.writesAcked.Add(1)
		default:
			c.rec.ret(op, rowOutput(res.Kind, res.Current))
			kn.sawRead(res.Current)
		}
	case p < 12: // CAS delete
		op := c.rec.call(c.id, lin.Input{Op: lin.OpDelete, Key: id, Expected: kn.row.Payload})
		res, err := c.st.CompareExchangeAuthority(ctx, key, kn.version, authority.Delete())
		if c.failed(op, err) {
			return
		}
		switch res.Kind {
		case authority.KindDeleted:
			c.rec.ret(op, lin.Output{Kind: res.Kind})
			kn.saw(nil)
			c.stats.writesAcked.Add(1)
		default:
			c.rec.ret(op, rowOutput(res.Kind, res.Current))
			kn.sawRead(res.Current)
		}
	case p < 15: // reserve
		op := c.rec.call(c.id, lin.Input{Op: lin.OpReserve, Key: id, Payload: payload})
		res, err := c.st.Reserve(ctx, reserveRequest(authority.ObjectUserSpot, id, c.tgt, payload))
		if c.failed(op, err) {
			return
		}
		switch res.Kind {
		case authority.KindReserved:
			c.rec.ret(op, lin.Output{Kind: res.Kind, Row: modelRow(res.Creating)})
			kn.saw(res.Creating)
			c.stats.writesAcked.Add(1)
		default:
			c.rec.ret(op, rowOutput(res.Kind, res.Current))
			kn.sawRead(res.Current)
		}
	case p < 18: // commit
		op := c.rec.call(c.id, lin.Input{Op: lin.OpCommit, Key: id, Expected: kn.row.Payload, Payload: payload, ReservationID: kn.resID})
		res, err := c.st.Commit(ctx, authority.CommitRequest{
			Key: authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: id}, ReservationID: kn.resID,
			ExpectedStoreVersion: kn.version, Target: c.tgt, ReadyPayload: []byte(payload),
		})
		if c.failed(op, err) {
			return
		}
		out := lin.Output{Kind: res.Kind}
		if res.Kind == authority.KindCommitted || res.Kind == authority.KindAlreadyCommitted {
			out.Row = modelRow(res.Ready)
			kn.saw(res.Ready)
			if res.Kind == authority.KindCommitted {
				c.stats.writesAcked.Add(1)
			}
		}
		c.rec.ret(op, out)
	default: // abort
		op := c.rec.call(c.id, lin.Input{Op: lin.OpAbort, Key: id, Expected: kn.row.Payload, ReservationID: kn.resID})
		res, err := c.st.Abort(ctx, authority.AbortRequest{
			Key: authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: id}, ReservationID: kn.resID,
			ExpectedStoreVersion: kn.version, Target: c.tgt,
		})
		if c.failed(op, err) {
			return
		}
		if res.Kind == authority.KindAborted {
			kn.saw(nil)
			c.stats.writesAcked.Add(1)
		}
		c.rec.ret(op, lin.Output{Kind: res.Kind})
	}
}

// failed records a write that returned err: discarded when it certainly
// did not apply, unknown otherwise. It reports whether err was set.
func (c *linClient) failed(op int, err error) bool {
	if err == nil {
		return false
	}
	if notApplied(err) {
		c.rec.discard(op)
	} else {
		c.rec.unknown(op)
	}
	return true
}

// workload is a set of linearizability clients over one owner.
type workload struct {
	rec     *recorder
	clients []*linClient
	stats   workerStats
}

// newWorkload makes n clients, each with its own etcd client of every
// member and its own store in namespace ns, over the given keys. The owner of
// tgt must be live.
func newWorkload[S authority.Store](t testing.TB, newClientStore func() S, tgt authority.CreationTarget, n int, keys []string, seed uint64) *workload {
	w := &workload{rec: &recorder{}}
	for i := range n {
		w.clients = append(w.clients, &linClient{
			id: i, st: newClientStore(), tgt: tgt, keys: keys, rec: w.rec,
			rng: rand.New(rand.NewPCG(seed, uint64(i))), last: map[string]*rowKnowledge{}, stats: &w.stats,
		})
	}
	return w
}

// run runs every client until ctx ends.
func (w *workload) run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, c := range w.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.run(ctx)
		}()
	}
	wg.Wait()
}

// keyNames returns n key global IDs with a prefix.
func keyNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// sleepCtx sleeps d or until ctx ends; it reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
