package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	authority "github.com/zlink-systems/authority"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// Row locks: the fence every write of an existing row carries for
// cross-shard aggregates (storeversion.RowLocks; package
// provider/sharded/twophase holds and resolves the locks).

// ErrRowLocked reports that a write found its row locked by the commit of
// a cross-shard aggregate. The write changed nothing. The error is a
// *RowLockedError naming the locks; it also matches
// authority.ErrUnavailable. A store of one cluster never meets one (only
// twophase writes row locks); a sharded store resolves the lock
// (twophase.Coordinator.Resolve) and writes again.
var ErrRowLocked = errors.New("etcd: row locked by a cross-shard aggregate")

// ErrNotFinalized reports a request that needs a store version the
// namespace is not finalized to (a cross-shard aggregate needs
// storeversion.RowLocks: every live process must compare row locks first).
// Nothing was written. It also matches authority.ErrInvalidArgument.
var ErrNotFinalized = errors.New("etcd: the namespace is not finalized to the store version this needs")

// RowLock is a row lock as read: the row's key, the commit attempt holding
// it and the lock's ModRevision in the row's store.
type RowLock struct {
	// Key is the locked row's key.
	Key authority.Key
	// Lock is the lock's value.
	Lock schema.RowLock
	// Revision is the lock key's ModRevision (its write).
	Revision int64
}

// RowLockedError is the error of a write that found rows locked.
type RowLockedError struct {
	// Locks are the locks the write found.
	Locks []RowLock
}

// Error names the first lock.
func (e *RowLockedError) Error() string {
	if len(e.Locks) == 0 {
		return ErrRowLocked.Error()
	}
	l := e.Locks[0]
	return fmt.Sprintf("%v: row %q is locked by aggregate %s/%d (incarnation %s, commit attempt %s); resolve it and write again",
		ErrRowLocked, l.Key, l.Lock.Fence.AggregateID, l.Lock.Fence.AggregateGeneration, l.Lock.Incarnation, l.Lock.Attempt)
}

// Is matches ErrRowLocked and authority.ErrUnavailable.
func (e *RowLockedError) Is(target error) bool {
	return target == ErrRowLocked || target == authority.ErrUnavailable
}

// notFinalized is the ErrNotFinalized of what needs storeversion.RowLocks.
func (s *Store) notFinalized(what string) error {
	return fmt.Errorf("%w: %s needs namespace %s at store version %s, and it is at %s: finalize it (authorityctl upgrade finalize) once every process runs this build (%w)",
		ErrNotFinalized, what, s.keys.Namespace(), storeversion.RowLocks, s.ActiveVersion(), authority.ErrInvalidArgument)
}

// lockFree fences t on the row at key holding no row lock, and reads the
// lock when t fails (sendWrite turns a lock found into a RowLockedError).
// Every Txn that writes an existing row calls it with the row's version
// compare: a row lock holds the row for its aggregate until the lock is
// applied or released. A lock is taken only on an active row at the version
// its aggregate expects, and no write changes or deletes a locked row, so a
// row that does not exist or is reserved is never locked: a reservation and
// the commit, abort or completion of one need no such compare.
func (s *Store) lockFree(t *txnkit.Txn, key authority.Key) {
	lk := s.keys.RowLock(key)
	t.Cmp(modRevIs(lk, 0))
	t.OrGet(lk)
}

// rowLocksFence fences t on the namespace being at storeversion.RowLocks
// (the active-version key at least the revision this store learned its
// version from, as the compact format's writes are), and refuses when the
// store does not know it to be.
func (s *Store) rowLocksFence(t *txnkit.Txn, what string) error {
	if !s.atLeast(storeversion.RowLocks) {
		return s.notFinalized(what)
	}
	t.CmpOnce(clientv3.Compare(clientv3.ModRevision(s.keys.ActiveVersion()), ">", s.version.activeRev.Load()-1))
	return nil
}

// locksIn returns the RowLockedError of a failed Txn whose Else read row
// locks that exist (nil: none).
func (s *Store) locksIn(resp *clientv3.TxnResponse) error {
	prefix := s.keys.RowLocksPrefix()
	var locked []RowLock
	for key, kv := range txnkit.ReadsOf(resp) {
		rest, ok := strings.CutPrefix(key, prefix)
		if !ok {
			continue
		}
		l, err := schema.DecodeRowLock(kv)
		if err != nil {
			return err
		}
		locked = append(locked, RowLock{Key: authority.Key(rest), Lock: l, Revision: kv.ModRevision})
	}
	if len(locked) == 0 {
		return nil
	}
	slices.SortFunc(locked, func(a, b RowLock) int { return strings.Compare(string(a.Key), string(b.Key)) })
	return &RowLockedError{Locks: locked}
}

// sendRaw sends t like sendWrite but leaves a failed Txn's row locks to the
// caller: the cross-shard operations compare locks themselves. It keeps the
// shard map fence (shardfence.go): a Txn that failed because the map moved
// on is ErrShardMapChanged.
func (s *Store) sendRaw(ctx context.Context, t *txnkit.Txn, what string) (*clientv3.TxnResponse, error) {
	t, mapRevs := s.fenceWrite(ctx, t)
	// the fenced Txn against etcd's own limits (planners keep room for
	// the fence: keepFenceRoom)
	if err := s.wire.Check(t, what); err != nil {
		return nil, err
	}
	resp, err := s.batch.Commit(ctx, t)
	if err == nil {
		if err := s.mapChanged(resp, mapRevs); err != nil {
			return nil, err
		}
	}
	return resp, err
}
