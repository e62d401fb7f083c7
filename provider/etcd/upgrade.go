package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// ErrFinalizeBlocked reports a finalize that a live process prevents: one
// announced without support for the target version, or an owner lease no
// process announced (an earlier build's, counted as storeversion.Base).
var ErrFinalizeBlocked = errors.New("etcd: finalize blocked by a live process")

// UpgradeStatus is who runs what on a namespace, read at one revision.
type UpgradeStatus struct {
	// Namespace is the namespace read.
	Namespace string
	// Active is the namespace's active store version.
	Active storeversion.Version
	// Revision is the etcd revision the status was read at.
	Revision int64
	// Announced holds one entry per live etcd lease with an announcement:
	// a store's own lease, and each owner lease it granted.
	Announced []AnnouncedLease
	// Unannounced holds the live owner liveness keys whose lease has no
	// announcement: an earlier build's owner, counted as Base.
	Unannounced []UnannouncedOwner

	activeRev, announcedRev, ownersRev int64
}

// AnnouncedLease is an announcement and the etcd lease it is attached to.
type AnnouncedLease struct {
	Lease int64
	schema.Announcement
	// Owners are the owner liveness keys on the lease (none for a store's
	// own lease).
	Owners []authority.OwnerToken
}

// UnannouncedOwner is a live owner liveness key no process announced.
type UnannouncedOwner struct {
	Owner     authority.OwnerToken
	Node      authority.NodeDescriptor
	Lifecycle int64
	Lease     int64
}

// Ceiling returns the newest version every live process works at: the
// highest target Finalize accepts now (Base while an unannounced owner
// lives).
func (u UpgradeStatus) Ceiling() storeversion.Version {
	ceiling := storeversion.Version(1<<31 - 1)
	if len(u.Unannounced) > 0 {
		ceiling = storeversion.Base
	}
	for _, a := range u.Announced {
		ceiling = min(ceiling, storeversion.Version(a.Max))
	}
	return ceiling
}

// Blockers names every live process that does not work at target.
func (u UpgradeStatus) Blockers(target storeversion.Version) []string {
	var out []string
	for _, a := range u.Announced {
		if !a.Supports(target) {
			out = append(out, fmt.Sprintf("%s %s (pid %d on %s, lease %x) works at versions %d to %d",
				a.Role, a.Build, a.PID, a.Host, a.Lease, a.Min, a.Max))
		}
	}
	if target != storeversion.Base {
		for _, o := range u.Unannounced {
			out = append(out, fmt.Sprintf("owner %s generation %d on %s/%s (lease %x) has no announcement: an earlier build, counted as version %d",
				o.Owner.OwnerID, o.Owner.LeaseGeneration, o.Node.MeshName, o.Node.RID, o.Lease, storeversion.Base))
		}
	}
	return out
}

// ReadUpgradeStatus reads namespace's active version, its announcements and
// its live owners at one revision. It needs no Store, so a build that cannot
// open one on the namespace (ErrVersionSkew) can still show it.
func ReadUpgradeStatus(ctx context.Context, kv clientv3.KV, namespace string) (UpgradeStatus, error) {
	if err := schema.ValidateNamespace(namespace); err != nil {
		return UpgradeStatus{}, err
	}
	l := schema.NewLayout(namespace)
	owners := schema.Prefix(namespace, schema.EntryOwnerLiveness)
	var (
		reads                        []clientv3.Op
		activeAt, announcedAt, ownAt txnkit.RangeRead
	)
	reads, activeAt = txnkit.AddRead(reads, clientv3.OpGet(l.ActiveVersion()))
	reads, announcedAt = txnkit.AddRead(reads, clientv3.OpGet(l.AnnouncementsPrefix(), clientv3.WithPrefix()))
	reads, ownAt = txnkit.AddRead(reads, clientv3.OpGet(owners, clientv3.WithPrefix()))
	resp, err := kv.Txn(ctx).Then(reads...).Commit()
	if err != nil {
		return UpgradeStatus{}, mapError(err, false)
	}
	u := UpgradeStatus{Namespace: namespace, Revision: resp.Header.Revision}
	active := firstKV(activeAt.In(resp))
	if u.Active, err = schema.DecodeActiveVersion(active); err != nil {
		return u, err
	}
	if active != nil {
		u.activeRev = active.ModRevision
	}
	byLease := map[int64]int{}
	for _, kv := range announcedAt.In(resp).Kvs {
		e, err := schema.DecodeEntry(namespace, kv)
		if err != nil {
			return u, err
		}
		u.announcedRev = max(u.announcedRev, kv.ModRevision)
		byLease[e.Lease] = len(u.Announced)
		u.Announced = append(u.Announced, AnnouncedLease{Lease: e.Lease, Announcement: *e.Announcement})
	}
	for _, kv := range ownAt.In(resp).Kvs {
		e, err := schema.DecodeEntry(namespace, kv)
		if err != nil {
			return u, err
		}
		u.ownersRev = max(u.ownersRev, kv.ModRevision)
		if i, ok := byLease[kv.Lease]; ok {
			u.Announced[i].Owners = append(u.Announced[i].Owners, e.Owner)
			continue
		}
		u.Unannounced = append(u.Unannounced, UnannouncedOwner{Owner: e.Owner, Node: e.Node, Lifecycle: e.Lifecycle, Lease: kv.Lease})
	}
	return u, nil
}

// FinalizeResult is what Finalize did or, dry, would do.
type FinalizeResult struct {
	// From and To are the active version before and after (To = From when
	// nothing moved).
	From, To storeversion.Version
	// Moved says the active version moved (false on a dry run).
	Moved bool
	// Revision is the etcd revision at which it moved (0 unless Moved).
	Revision int64
	// Status is the status Finalize decided on.
	Status UpgradeStatus
}

// Finalize moves namespace's active version forward to target, once every
// live process works at it: a Txn that holds only if the active version, the
// announcements and the owner liveness keys are what the status read saw
// (a process that announced or an owner that appeared after the read fails
// it, and Finalize reads again). Finalize never moves a version back; a
// target at or below the active version changes nothing. With dryRun it
// checks and writes nothing. A blocked finalize returns ErrFinalizeBlocked
// naming every process in the way; a target this build does not know is
// ErrInvalidArgument.
func Finalize(ctx context.Context, kv clientv3.KV, namespace string, target storeversion.Version, dryRun bool) (FinalizeResult, error) {
	return finalize(ctx, kv, namespace, target, dryRun, func() {})
}

// finalize is Finalize, calling afterRead between each status read and its
// Txn (tests use it to race the read).
func finalize(ctx context.Context, kv clientv3.KV, namespace string, target storeversion.Version, dryRun bool, afterRead func()) (FinalizeResult, error) {
	if !storeversion.Known(target) {
		return FinalizeResult{}, authority.Invalid(fmt.Sprintf(
			"store version %d is not one this build knows (%s to %s).", target, storeversion.MinSupported, storeversion.Latest))
	}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		u, err := ReadUpgradeStatus(ctx, kv, namespace)
		if err != nil {
			return FinalizeResult{}, err
		}
		res := FinalizeResult{From: u.Active, To: u.Active, Status: u}
		if target <= u.Active {
			return res, nil
		}
		if b := u.Blockers(target); len(b) > 0 {
			return res, fmt.Errorf("%w: %s cannot move to store version %s: %s", ErrFinalizeBlocked,
				namespace, target, strings.Join(b, "; "))
		}
		if dryRun {
			res.To = target
			return res, nil
		}
		afterRead()
		l := schema.NewLayout(namespace)
		owners := schema.Prefix(namespace, schema.EntryOwnerLiveness)
		tresp, err := kv.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(l.ActiveVersion()), "=", u.activeRev),
			clientv3.Compare(clientv3.ModRevision(l.AnnouncementsPrefix()), "<", u.Revision+1).WithPrefix(),
			clientv3.Compare(clientv3.ModRevision(owners), "<", u.Revision+1).WithPrefix(),
		).Then(clientv3.OpPut(l.ActiveVersion(), schema.EncodeActiveVersion(target))).Commit()
		if err != nil {
			return res, mapError(err, true)
		}
		if tresp.Succeeded {
			res.To, res.Moved, res.Revision = target, true, tresp.Header.Revision
			return res, nil
		}
	}
	return FinalizeResult{}, authority.Wrap(authority.ErrUnavailable,
		"finalize: processes kept announcing or owners kept appearing during every attempt", errContention)
}

// UpgradeStatus reads the store's namespace's upgrade status
// (ReadUpgradeStatus).
func (s *Store) UpgradeStatus(ctx context.Context) (UpgradeStatus, error) {
	if err := s.begin(ctx); err != nil {
		return UpgradeStatus{}, err
	}
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	return ReadUpgradeStatus(ctx, s.kv, s.keys.Namespace())
}

// Finalize moves the store's namespace to target (Finalize); the store
// follows the new version at once. A read-only store (Config.ReadOnly)
// makes only dry runs.
func (s *Store) Finalize(ctx context.Context, target storeversion.Version, dryRun bool) (FinalizeResult, error) {
	if err := s.begin(ctx); err != nil {
		return FinalizeResult{}, err
	}
	if !dryRun {
		if err := s.refuseWrite(); err != nil {
			return FinalizeResult{}, err
		}
	}
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	res, err := Finalize(ctx, s.kv, s.keys.Namespace(), target, dryRun)
	if err == nil && res.Moved {
		s.version.raise(res.To, res.Revision)
	}
	return res, err
}
