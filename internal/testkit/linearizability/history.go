package linearizability

import (
	"sort"
	"sync"

	"github.com/anishathalye/porcupine"
)

// History records the operations of concurrent clients. Timestamps are a
// logical clock taken under the History's lock, so their order is the real
// order of the Call and Return calls. The zero value is ready to use and
// safe for concurrent use.
type History struct {
	mu    sync.Mutex
	clock int64
	ops   []record
}

// record is one operation in a History.
type record struct {
	client int
	input  Input
	call   int64
	ret    int64 // 0 while pending
	output Output
	done   bool // Return or Unknown was called
}

// CallID names a recorded call, for its Return or Unknown.
type CallID int

// Call records that client starts in and returns its CallID. A client has
// one operation at a time; after an Unknown it may go on with the next.
func (h *History) Call(client int, in Input) CallID {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.clock++
	h.ops = append(h.ops, record{client: client, input: in, call: h.clock})
	return CallID(len(h.ops) - 1)
}

// Return records the observed outcome of call id.
func (h *History) Return(id CallID, out Output) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := &h.ops[id]
	if r.done {
		panic("linearizability: call returned twice")
	}
	h.clock++
	r.ret, r.output, r.done = h.clock, out, true
}

// Unknown records that the outcome of call id is unknown (a timeout, a lost
// reply, a failure after the request may have been sent): the operation may
// take effect at any time after its call, or never. A call neither returned
// nor marked unknown when the history is checked counts as unknown too.
func (h *History) Unknown(id CallID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := &h.ops[id]
	if r.done {
		panic("linearizability: call returned twice")
	}
	r.output, r.done = Output{Unknown: true}, true
}

// Len returns the number of recorded calls.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops)
}

// Operations returns the history for porcupine. An operation of unknown
// outcome returns after every other event (porcupine's "infinite" return
// time) with Output.Unknown set. Client IDs become visualization lanes: a
// client's operations after an unknown one move to a new lane, since the
// unknown one stays open.
func (h *History) Operations() []porcupine.Operation {
	h.mu.Lock()
	recs := append([]record(nil), h.ops...)
	end := h.clock + 1
	h.mu.Unlock()

	sort.SliceStable(recs, func(i, j int) bool { return recs[i].call < recs[j].call })
	lanes := map[int]int{} // client → current lane
	next := 0
	ops := make([]porcupine.Operation, 0, len(recs))
	for _, r := range recs {
		lane, ok := lanes[r.client]
		if !ok {
			lane = next
			next++
			lanes[r.client] = lane
		}
		op := porcupine.Operation{ClientId: lane, Input: r.input, Call: r.call, Output: r.output, Return: r.ret}
		if !r.done || r.output.Unknown {
			op.Output = Output{Unknown: true}
			op.Return = end
			lanes[r.client] = next
			next++
		}
		ops = append(ops, op)
	}
	return ops
}
