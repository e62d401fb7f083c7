package etcd

import (
	authority "github.com/zlink-systems/authority"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// writeFormat returns the active version whose stored format a value put
// in t is written in. Once the namespace is at storeversion.CompactFormat
// (a format no earlier build reads), t is fenced on it: t compares the
// active-version key's ModRevision with the revision the store learned the
// version at, so t fails rather than write the compact format if the key
// is not the one (or a later one than) the store learned it from. The
// active version only moves forward and only finalize writes it, so any
// such key holds CompactFormat or a later version.
func (s *Store) writeFormat(t *txnkit.Txn) storeversion.Version {
	v := s.ActiveVersion()
	if !schema.Compact(v) {
		return v
	}
	fence := clientv3.Compare(clientv3.ModRevision(s.keys.ActiveVersion()), ">", s.version.activeRev.Load()-1)
	t.CmpOnce(fence)
	return v
}

// rowValue is r's stored value in the namespace's write format (writeFormat
// fences t when that format needs it). r is a row being written (never one
// the cache handed out): a committed reservation whose answer has ended
// (storeversion.FewerKeys) is dropped from it first, as a reservation
// terminal's lease would drop the terminal.
func (s *Store) rowValue(t *txnkit.Txn, r *schema.Row) string {
	if r.Committed != nil && !r.Committed.Until.After(s.clock.Now()) {
		r.Committed = nil
	}
	return r.EncodeAt(s.writeFormat(t))
}

// capacityValue is the stored value of a capacity entry holding c in state,
// in the namespace's write format.
func (s *Store) capacityValue(t *txnkit.Txn, state authority.AllocationState, c authority.CapacityVector) string {
	return schema.EncodeCapacityEntryAt(s.writeFormat(t), state, c)
}
