package linearizability

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"

	"github.com/zlink-systems/authority"
)

// fakeStore is an independent in-memory implementation of the row contract
// under one lock (linearizable), optionally serving reads from a copy taken
// every few writes (not linearizable).
type fakeStore struct {
	mu        sync.Mutex
	rows      map[string]Row
	terminals map[string]terminal
	nextID    int
	staleRead bool
	snapshot  map[string]Row
	writes    int
}

func newFakeStore(staleRead bool) *fakeStore {
	return &fakeStore{rows: map[string]Row{}, terminals: map[string]terminal{}, staleRead: staleRead, snapshot: map[string]Row{}}
}

func (s *fakeStore) wrote() {
	s.writes++
	if s.writes%5 == 0 {
		s.snapshot = map[string]Row{}
		for k, r := range s.rows {
			s.snapshot[k] = r
		}
	}
}

func (s *fakeStore) do(in Input) Output {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.rows[in.Key]
	switch in.Op {
	case OpRead:
		if s.staleRead {
			r, ok = s.snapshot[in.Key]
		}
		if !ok {
			return Output{Kind: authority.KindMissing}
		}
		return Output{Kind: authority.KindSnapshot, Row: r}
	case OpPut, OpDelete:
		if !ok || r.State != Active || r.Payload != in.Expected {
			return Output{Kind: authority.KindConflict, Row: r}
		}
		defer s.wrote()
		if in.Op == OpDelete {
			delete(s.rows, in.Key)
			return Output{Kind: authority.KindDeleted}
		}
		s.rows[in.Key] = Row{State: Active, Payload: in.Payload}
		return Output{Kind: authority.KindStored, Row: s.rows[in.Key]}
	case OpReserve:
		if ok && r.State == Active {
			return Output{Kind: authority.KindAlreadyExists, Row: r}
		}
		if ok {
			return Output{Kind: authority.KindConflict, Row: r}
		}
		s.nextID++
		s.rows[in.Key] = Row{State: Reserved, Payload: in.Payload, ReservationID: fmt.Sprintf("r%d", s.nextID)}
		s.wrote()
		return Output{Kind: authority.KindReserved, Row: s.rows[in.Key]}
	case OpCommit:
		if s.terminals[in.ReservationID] == committed && ok && r.State == Active {
			return Output{Kind: authority.KindAlreadyCommitted, Row: r}
		}
		if !ok || r.State != Reserved || r.ReservationID != in.ReservationID || r.Payload != in.Expected {
			return Output{Kind: authority.KindStale}
		}
		s.rows[in.Key] = Row{State: Active, Payload: in.Payload}
		s.terminals[in.ReservationID] = committed
		s.wrote()
		return Output{Kind: authority.KindCommitted, Row: s.rows[in.Key]}
	case OpAbort:
		if s.terminals[in.ReservationID] == aborted {
			return Output{Kind: authority.KindAlreadyAborted}
		}
		if !ok || r.State != Reserved || r.ReservationID != in.ReservationID || r.Payload != in.Expected {
			return Output{Kind: authority.KindStale}
		}
		delete(s.rows, in.Key)
		s.terminals[in.ReservationID] = aborted
		s.wrote()
		return Output{Kind: authority.KindAborted}
	}
	panic("unknown op")
}

// runClients drives 8 clients over 3 keys against s, recording into h.
// About one operation in 20 "times out": it is applied or not (at random)
// and recorded as unknown.
func runClients(t *testing.T, s *fakeStore, seed uint64, opsPerClient int) *History {
	t.Helper()
	h := &History{}
	keys := []string{"k0", "k1", "k2"}
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(c)))
			last := map[string]Row{} // what this client last saw per key
			for n := range opsPerClient {
				key := keys[rng.IntN(len(keys))]
				payload := fmt.Sprintf("c%d-%d", c, n) // unique
				seenRow := last[key]
				var in Input
				switch p := rng.IntN(10); {
				case p < 3:
					in = read(key)
				case p < 5:
					in = put(key, seenRow.Payload, payload)
				case p < 6:
					in = del(key, seenRow.Payload)
				case p < 8:
					in = reserve(key, payload)
				case p < 9:
					in = commit(key, seenRow.ReservationID, seenRow.Payload, payload)
				default:
					in = abort(key, seenRow.ReservationID, seenRow.Payload)
				}
				id := h.Call(c, in)
				if rng.IntN(20) == 0 {
					if rng.IntN(2) == 0 {
						s.do(in)
					}
					h.Unknown(id)
					continue
				}
				out := s.do(in)
				h.Return(id, out)
				switch out.Kind {
				case authority.KindMissing, authority.KindDeleted, authority.KindAborted:
					last[key] = Row{}
				case authority.KindSnapshot, authority.KindConflict, authority.KindAlreadyExists,
					authority.KindStored, authority.KindReserved, authority.KindCommitted, authority.KindAlreadyCommitted:
					last[key] = out.Row
				}
			}
		}()
	}
	wg.Wait()
	return h
}

func TestConcurrentClientsOnLinearizableStorePass(t *testing.T) {
	for seed := range uint64(5) {
		h := runClients(t, newFakeStore(false), seed, 60)
		require.Equal(t, 8*60, h.Len())
		require.True(t, Check(t, h), "seed %d", seed)
	}
}

func TestConcurrentClientsOnStaleReadStoreFail(t *testing.T) {
	illegal := 0
	for seed := range uint64(5) {
		h := runClients(t, newFakeStore(true), seed, 60)
		if verdictOf(t, h) == porcupine.Illegal {
			illegal++
		}
	}
	t.Logf("stale-read store: illegal=%d/5", illegal)
	require.Equal(t, 5, illegal, "every run of a store serving stale reads must be caught")
}
