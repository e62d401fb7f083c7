package faults_test

import (
	"sync"

	authority "github.com/zlink-systems/authority"
	lin "github.com/zlink-systems/authority/internal/testkit/linearizability"
)

// recorder collects the operations of concurrent clients in real order and
// turns them into a linearizability.History. Unlike History it can discard
// an operation that certainly did not take effect (a read that failed, a
// write refused before it was processed): such an operation is left out of
// the history, as if it was never called.
type recorder struct {
	mu     sync.Mutex
	ops    []recOp
	events []recEvent
}

type recEnd int

const (
	endPending recEnd = iota
	endReturned
	endUnknown
	endDiscarded
)

type recOp struct {
	client int
	in     lin.Input
	out    lin.Output
	end    recEnd
}

// recEvent is a call (call true) or the end of op.
type recEvent struct {
	op   int
	call bool
}

// call records that client starts in.
func (r *recorder) call(client int, in lin.Input) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, recOp{client: client, in: in})
	id := len(r.ops) - 1
	r.events = append(r.events, recEvent{op: id, call: true})
	return id
}

func (r *recorder) finish(id int, end recEnd, out lin.Output) {
	r.mu.Lock()
	defer r.mu.Unlock()
	op := &r.ops[id]
	if op.end != endPending {
		panic("recorder: operation ended twice")
	}
	op.end, op.out = end, out
	if end != endDiscarded {
		r.events = append(r.events, recEvent{op: id})
	}
}

// ret records the observed outcome of id.
func (r *recorder) ret(id int, out lin.Output) { r.finish(id, endReturned, out) }

// unknown records that the outcome of id is unknown.
func (r *recorder) unknown(id int) { r.finish(id, endUnknown, lin.Output{}) }

// discard records that id certainly did not take effect.
func (r *recorder) discard(id int) { r.finish(id, endDiscarded, lin.Output{}) }

// recCounts is what a recorder holds.
type recCounts struct {
	returned, unknown, discarded int
}

// history replays the recorded events, in order, into a History; discarded
// operations are left out.
func (r *recorder) history() (*lin.History, recCounts) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var n recCounts
	for _, op := range r.ops {
		switch op.end {
		case endReturned:
			n.returned++
		case endUnknown, endPending:
			n.unknown++
		case endDiscarded:
			n.discarded++
		}
	}
	h := &lin.History{}
	ids := make(map[int]lin.CallID, len(r.ops))
	for _, ev := range r.events {
		op := r.ops[ev.op]
		if op.end == endDiscarded {
			continue
		}
		if ev.call {
			ids[ev.op] = h.Call(op.client, op.in)
			continue
		}
		switch op.end {
		case endReturned:
			h.Return(ids[ev.op], op.out)
		case endUnknown:
			h.Unknown(ids[ev.op])
		}
	}
	return h, n
}

// withForgedRead returns the history with the first successful read of a row
// answered by a payload nobody wrote (nil when there is no such read). The
// first one keeps porcupine's search for a linearization short.
func (r *recorder) withForgedRead() *lin.History {
	r.mu.Lock()
	forged := &recorder{ops: append([]recOp(nil), r.ops...), events: append([]recEvent(nil), r.events...)}
	r.mu.Unlock()
	for i := range forged.ops {
		op := &forged.ops[i]
		if op.in.Op == lin.OpRead && op.end == endReturned && op.out.Kind == authority.KindSnapshot {
			op.out.Row.Payload = "forged-never-written"
			h, _ := forged.history()
			return h
		}
	}
	return nil
}
