package etcd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// ErrVersionSkew reports a namespace whose active store version this build
// cannot work at: a later build finalized it (upgrade this process), or it
// is older than this build's oldest (run the release before this one and
// finalize first). New returns it, naming both versions; a running store
// that sees its namespace finalized past its build refuses every request
// with it.
var ErrVersionSkew = errors.New("etcd: store version skew")

// announceTTL is the TTL of the lease a store's own announcement is attached
// to: a dead process drops out of the announcements within it.
const announceTTL = 10 * time.Second

// versionGate is what a store knows of its namespace's store version.
type versionGate struct {
	active atomic.Int32
	// activeRev is the highest ModRevision of the active-version key the
	// store learned its version from (0: absent). It is raised before
	// active, so a reader that loads active then activeRev gets a revision
	// at which the key held that version or a later one (formatFence).
	activeRev atomic.Int64
	// skew is set once the namespace moved to a version this build cannot
	// work at; every request then fails with it.
	skew atomic.Pointer[error]
	// lease is the store's own announcement lease.
	lease atomic.Int64
	// announcement is the encoded announcement of this process, put under
	// the store's own lease and every owner lease it grants.
	announcement string
	followed     chan struct{} // closed when follow returns
}

// announcementOf is the announcement of a store configured by cfg.
func announcementOf(cfg Config) schema.Announcement {
	host, _ := os.Hostname()
	a := schema.Announcement{Build: cfg.Build, Role: cfg.Role, Host: host, PID: os.Getpid(),
		Min: int32(storeversion.MinSupported), Max: int32(storeversion.Latest), Started: time.Now().UTC().Truncate(time.Millisecond)}
	if a.Role == "" {
		a.Role = "store"
	}
	if a.Build == "" {
		a.Build = buildName()
	}
	if a.Host == "" {
		a.Host = "unknown"
	}
	return a
}

// buildName names the running binary: its main module's version, else its
// VCS revision, else "devel".
func buildName() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	name := info.Main.Version
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			name = s.Value[:12]
		}
		if s.Key == "vcs.modified" && s.Value == "true" {
			name += "+dirty"
		}
	}
	if name == "" || name == "(devel)" {
		return "devel"
	}
	return name
}

// startVersion announces the store and learns the namespace's active
// version (bootstrapping an empty namespace at Latest), refusing one this
// build cannot work at, and, before writing anything, a namespace that is
// one shard of several unless the store is a shard member
// (refuseShardedNamespace); then it follows the version and keeps the
// announcement alive until Close. A read-only store only reads and follows
// the version.
func (s *Store) startVersion(ctx context.Context, cfg Config) error {
	s.version.announcement = announcementOf(cfg).Encode()
	s.version.followed = make(chan struct{})
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	if _, has := ctx.Deadline(); !has {
		var c2 context.CancelFunc
		ctx, c2 = context.WithTimeout(ctx, max(s.dialTimeout, announceTTL))
		defer c2()
	}
	if s.readOnly {
		return s.startReadOnly(ctx)
	}
	var err error
	if s.standing.on {
		s.standing.rev, err = s.refuseShardedNamespace(ctx)
	}
	if err == nil {
		err = s.bootstrapVersion(ctx)
	}
	if err != nil {
		close(s.version.followed)
		return err
	}
	rev, err := s.announce(ctx)
	if err != nil {
		close(s.version.followed)
		return err
	}
	go s.followVersion(rev)
	return nil
}

// startReadOnly is startVersion of a read-only store: it reads the active
// version (refusing one this build cannot work at) and follows it, and
// neither bootstraps nor announces.
func (s *Store) startReadOnly(ctx context.Context) error {
	resp, err := s.kv.Get(ctx, s.keys.ActiveVersion())
	if err != nil {
		err = mapError(err, false)
	} else {
		err = s.learnVersion(firstKV((*pb.RangeResponse)(resp)))
	}
	if err != nil {
		close(s.version.followed)
		return err
	}
	go func() {
		defer close(s.version.followed)
		s.followWhileAnnounced(s.life, resp.Header.Revision, nil) // nil: never lost
	}()
	return nil
}

// bootstrapVersion sets the active version of an empty namespace to Latest,
// as a new cluster starts at its binary's version. The Txn holds only if no
// key of the namespace was written since the read that found it empty; a
// namespace with any key (an earlier build's) stays where it is.
func (s *Store) bootstrapVersion(ctx context.Context) error {
	// a namespace with its version set needs nothing: skip the range read
	// below, which etcd counts to the namespace's end (0.24 s at 1M rows)
	active, err := s.kv.Get(ctx, s.keys.ActiveVersion(), clientv3.WithKeysOnly())
	if err != nil {
		return mapError(err, false)
	}
	if len(active.Kvs) > 0 {
		return nil
	}
	ns := s.keys.Namespace()
	resp, err := s.kv.Get(ctx, ns, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err != nil {
		return mapError(err, false)
	}
	if len(resp.Kvs) > 0 {
		return nil
	}
	_, err = s.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(ns), "<", resp.Header.Revision+1).WithPrefix()).
		Then(clientv3.OpPut(s.keys.ActiveVersion(), schema.EncodeActiveVersion(storeversion.Latest))).
		Commit()
	// a failed compare: someone wrote meanwhile, and the namespace stays
	// at the version they left it at
	return mapError(err, true)
}

// announce grants the store's announcement lease, puts the announcement on
// it and reads the active version in the same Txn, so that a finalize that
// read the announcements before it cannot commit after it (its compare on
// the announcements fails). It returns the Txn's revision.
func (s *Store) announce(ctx context.Context) (int64, error) {
	grant, err := s.client.Grant(ctx, int64(announceTTL/time.Second))
	if err != nil {
		return 0, mapError(err, false)
	}
	ops := []clientv3.Op{clientv3.OpPut(s.keys.Announcement(int64(grant.ID)), s.version.announcement, clientv3.WithLease(grant.ID))}
	ops, activeAt := txnkit.AddRead(ops, clientv3.OpGet(s.keys.ActiveVersion()))
	resp, err := s.kv.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		s.revokeDetached(ctx, grant.ID)
		return 0, mapError(err, true)
	}
	if err := s.learnVersion(firstKV(activeAt.In(resp))); err != nil {
		s.revokeDetached(ctx, grant.ID)
		return 0, err
	}
	if old := s.version.lease.Swap(int64(grant.ID)); old != 0 {
		s.revokeDetached(ctx, clientv3.LeaseID(old))
	}
	return resp.Header.Revision, nil
}

// learnVersion takes the active-version key's value (nil: absent) as the
// namespace's version, or refuses it.
func (s *Store) learnVersion(kv *mvccpb.KeyValue) error {
	v, err := schema.DecodeActiveVersion(kv)
	if err != nil {
		return err
	}
	if !storeversion.Known(v) {
		err := skewError(s.keys.Namespace(), v)
		s.version.skew.Store(&err)
		return err
	}
	var rev int64
	if kv != nil {
		rev = kv.ModRevision
	}
	s.version.raise(v, rev)
	return nil
}

// raise moves the version the store works at forward to v, learned from the
// active-version key at ModRevision rev (never back: a finalize the store
// made itself may be seen before or after its watch event).
func (g *versionGate) raise(v storeversion.Version, rev int64) {
	for {
		cur := g.activeRev.Load()
		if rev <= cur || g.activeRev.CompareAndSwap(cur, rev) {
			break
		}
	}
	for {
		cur := g.active.Load()
		if int32(v) <= cur || g.active.CompareAndSwap(cur, int32(v)) {
			return
		}
	}
}

// skewError is ErrVersionSkew for a namespace at v.
func skewError(ns string, v storeversion.Version) error {
	if v > storeversion.Latest {
		return fmt.Errorf("%w: namespace %s is at store version %s, and this build works at versions %s to %s: "+
			"run a build that supports version %d (a namespace is never moved back once finalized)",
			ErrVersionSkew, ns, v, storeversion.MinSupported, storeversion.Latest, v)
	}
	return fmt.Errorf("%w: namespace %s is at store version %s, older than this build's oldest, %s: "+
		"run an earlier release on it and finalize it to %d first",
		ErrVersionSkew, ns, v, storeversion.MinSupported, storeversion.MinSupported)
}

// ActiveVersion returns the namespace's active store version as this store
// last saw it (it follows the active-version key with a watch).
func (s *Store) ActiveVersion() storeversion.Version {
	return storeversion.Version(s.version.active.Load())
}

// atLeast reports whether the namespace is at v or later: the gate of every
// change storeversion names.
func (s *Store) atLeast(v storeversion.Version) bool { return s.ActiveVersion() >= v }

// versionSkew returns the ErrVersionSkew the store refuses requests with,
// or nil.
func (s *Store) versionSkew() error {
	if e := s.version.skew.Load(); e != nil {
		return *e
	}
	return nil
}

// announceOwnerLease puts this process's announcement under an owner's
// etcd lease, in the Txn that writes the owner's liveness key on it.
func (s *Store) announceOwnerLease(t *txnkit.Txn, lease clientv3.LeaseID) {
	t.Put(s.keys.Announcement(int64(lease)), s.version.announcement, clientv3.WithLease(lease))
}

// closeVersion stops following the version and revokes the store's
// announcement lease.
func (s *Store) closeVersion(ctx context.Context) {
	if s.version.followed == nil {
		return
	}
	<-s.version.followed
	if id := s.version.lease.Swap(0); id != 0 {
		_, _ = s.client.Revoke(ctx, clientv3.LeaseID(id))
	}
}

// firstKV returns a range response's first key-value, or nil.
func firstKV(r *pb.RangeResponse) *mvccpb.KeyValue {
	if r == nil || len(r.Kvs) == 0 {
		return nil
	}
	return r.Kvs[0]
}
