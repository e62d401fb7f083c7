// Package capacitytest holds what the capacity-writer tests share: writers
// that reserve and release against a node under a capacity policy, counting
// the capacity they hold at once and its peak. Only tests import it.
package capacitytest

import (
	"crypto/sha256"
	"sync"
	"sync/atomic"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
)

// ActorReservation is a valid reservation of the actor id on target, with
// content reference "content-"+id and creating payload "creating "+id.
func ActorReservation(id string, target authority.CreationTarget) authority.ReserveRequest {
	ref := "content-" + id
	sum := sha256.Sum256([]byte(ref))
	return authority.ReserveRequest{
		Key: authority.ObjectKey{Kind: authority.ObjectActor, GlobalID: id},
		Intent: authority.CreationIntent{StableType: conformance.DefaultStableType, RequestContentReference: ref,
			RequestSHA256: sum[:], RequestEncodedSize: int64(len(ref))},
		Target: target, CreatingPayload: []byte("creating " + id),
		Capacity: conformance.Capacity(authority.ObjectActor, conformance.DefaultStableType),
	}
}

// Took adds one to holding (a lower bound of the capacity the writers hold
// at once: +1 once a reservation is acknowledged, -1 before its release is
// sent) and raises peak to the new value when it is higher.
func Took(holding, peak *atomic.Int64) {
	n := holding.Add(1)
	for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
	}
}

// Each runs f on every writer at once and returns when all returned.
func Each[W any](writers []W, f func(w W)) {
	var wg sync.WaitGroup
	for _, w := range writers {
		wg.Go(func() { f(w) })
	}
	wg.Wait()
}
