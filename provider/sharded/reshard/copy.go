package reshard

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.etcd.io/etcd/api/v3/mvccpb"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
	"github.com/zlink-systems/authority/provider/sharded"
)

// listPage is how many keys a listing of a source reads at a time.
const listPage = 512

// change is one key's state to copy: the source's key-value (nil: the
// key is deleted there), and its key relative to the namespaces.
type change struct {
	rel string
	kv  *mvccpb.KeyValue
	row bool // a row (not a terminal or index entry), counted as moved
}

// copying writes the pending move in every cluster, then copies every
// source's keys that move, from a listing at one revision.
func (j *job) copying(ctx context.Context) error {
	if err := j.refuseBeforeRowMoves(); err != nil {
		return err
	}
	if err := j.pend(ctx); err != nil {
		return err
	}
	j.countRows(ctx)
	for i := range j.srcs {
		if err := j.copySource(ctx, i); err != nil {
			return err
		}
	}
	return j.next(ctx, schema.PhaseCatchUp)
}

// refuseBeforeRowMoves refuses, before the move writes anything, a cluster
// whose namespace is not finalized to storeversion.RowMoves: in the new
// cluster, rows copied there could not be read by every process; in a
// source, a process of a build before it may run there, which neither
// fences its writes on the shard map nor stops at the freeze, so a write
// it made after the switch would be lost.
func (j *job) refuseBeforeRowMoves() error {
	for i, s := range append([]*etcdstore.Store{j.dst}, j.srcs...) {
		if v := s.ActiveVersion(); v < storeversion.RowMoves {
			where, why := "The new cluster's namespace", "rows copied there could not be read by every process"
			if i > 0 {
				where, why = fmt.Sprintf("Shard %d's namespace", i-1), "a process of an earlier build may write there without the shard map fence"
			}
			return authority.Wrap(authority.ErrInvalidArgument, fmt.Sprintf(
				"%s is at store version %s, before %s: %s; finalize it first.", where, v, storeversion.RowMoves, why), etcdstore.ErrVersionSkew)
		}
	}
	return nil
}

// pend writes the pending move in the new cluster, then in every source
// (each only while its map in force is the move's From map, and no other
// move is pending there).
func (j *job) pend(ctx context.Context) error {
	j.at("pending")
	mv := j.rec.Move
	for i, s := range append([]*etcdstore.Store{j.dst}, j.srcs...) {
		k, err := s.Moves().ReadMap(ctx)
		if err != nil {
			return err
		}
		if k.Pending != nil && k.Pending.Job == mv.Job {
			continue
		}
		ok, k, err := s.Moves().Begin(ctx, mv, k, i == 0)
		if err != nil {
			return err
		}
		if !ok && (k.Pending == nil || k.Pending.Job != mv.Job) {
			where := "the new cluster"
			if i > 0 {
				where = fmt.Sprintf("shard %d", i-1)
			}
			return fmt.Errorf("%w: %s cannot take the pending move (another move pending, a map or rows in the new cluster, or the map moved)", ErrOtherMove, where)
		}
	}
	return nil
}

// countRows estimates the rows that move: the sources' rows over the
// next map's shard count (the hash moves about that share).
func (j *job) countRows(ctx context.Context) {
	var total int64
	for _, s := range j.srcs {
		n, err := s.Moves().Count(ctx, schema.SegRows+"/")
		if err != nil {
			return
		}
		total += n
	}
	j.mu.Lock()
	j.rate.estimate = total / int64(len(j.rec.Move.To.Shards))
	j.mu.Unlock()
}

// copySource copies source i's keys that move, from its listing at one
// revision (resumed after the last key copied), then marks it listed: its
// changes after the listing are followed from there (follow.go).
func (j *job) copySource(ctx context.Context, i int) error {
	st := &j.rec.Sources[i]
	for !st.Listed {
		if st.ListRev == 0 {
			rev, err := j.srcs[i].Moves().Revision(ctx)
			if err != nil {
				return err
			}
			st.ListRev, st.After = rev, ""
			if err := j.save(ctx); err != nil {
				return err
			}
		}
		err := j.copyListing(ctx, i)
		if errors.Is(err, authority.ErrFeedCompacted) {
			err = j.restartSource(ctx, i) // the listing's revision was compacted
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// copyListing copies source i's listing from its last key copied.
func (j *job) copyListing(ctx context.Context, i int) error {
	st := &j.rec.Sources[i]
	if err := j.raise(ctx, st.ListRev); err != nil {
		return err
	}
	for {
		j.at(fmt.Sprintf("copying shard %d after %q", i, st.After))
		kvs, _, more, err := j.srcs[i].Moves().List(ctx, "", st.After, st.ListRev, listPage)
		if err != nil {
			return err
		}
		var cs []change
		for _, kv := range kvs {
			if c, ok := j.moving(i, kv, false); ok {
				cs = append(cs, c)
			}
		}
		if err := j.applyFresh(ctx, i, cs); err != nil {
			return err
		}
		if len(kvs) > 0 {
			st.After = j.srcs[i].Moves().Rel(string(kvs[len(kvs)-1].Key))
		}
		if !more || len(kvs) == 0 {
			st.Listed, st.Applied = true, st.ListRev
		}
		if err := j.save(ctx); err != nil {
			return err
		}
		if st.Listed {
			return nil
		}
		if err := j.checkpoint(ctx); err != nil {
			return err
		}
	}
}

// restartSource deletes from the new cluster every key copied from source
// i, and starts its listing again at the current revision (its listing's
// or its watch's revision was compacted away).
func (j *job) restartSource(ctx context.Context, i int) error {
	j.at(fmt.Sprintf("restarting the copy of shard %d (compacted)", i))
	if err := j.clearTarget(ctx, func(kind schema.MoveKind, row authority.Key) bool {
		return kind == schema.MoveWithRow && sharded.Place(row, len(j.rec.Move.From.Shards)) == i
	}); err != nil {
		return err
	}
	j.rec.Sources[i] = schema.ReshardSource{}
	return j.save(ctx)
}

// moving returns the change a source key-value makes in the new cluster
// (ok false: the key does not move). A deleted key (deleted true, kv its
// delete event's) is a deletion there.
func (j *job) moving(i int, kv *mvccpb.KeyValue, deleted bool) (change, bool) {
	m := j.srcs[i].Moves()
	kind, row, _ := m.KindOf(string(kv.Key))
	switch kind {
	case schema.MoveWithRow:
		from, to := len(j.rec.Move.From.Shards), len(j.rec.Move.To.Shards)
		if sharded.Place(row, from) != i || sharded.Place(row, to) != from {
			return change{}, false
		}
	case schema.MoveCopied:
	default:
		return change{}, false
	}
	c := change{rel: m.Rel(string(kv.Key)), kv: kv}
	c.row = kind == schema.MoveWithRow && m.Rel(string(kv.Key)) == schema.SegRows+"/"+string(row)
	if deleted {
		c.kv = nil
	}
	return c, true
}

// apply makes the new cluster's keys equal the changes of source i, in
// Txns of at most Batch keys, the cluster's revision first raised above
// every change's.
func (j *job) apply(ctx context.Context, i int, cs []change) error {
	return j.applyAll(ctx, i, cs, false)
}

// applyFresh is apply for a listing's keys, which the new cluster most
// likely lacks: each Txn is first sent expecting them absent (no read
// before it), and read and sent again when that fails (a resumed copy).
func (j *job) applyFresh(ctx context.Context, i int, cs []change) error {
	return j.applyAll(ctx, i, cs, true)
}

func (j *job) applyAll(ctx context.Context, i int, cs []change, absent bool) error {
	for len(cs) > 0 {
		n := min(len(cs), j.cfg.Batch)
		if err := j.applyBatch(ctx, i, cs[:n], absent); err != nil {
			return err
		}
		cs = cs[n:]
	}
	return nil
}

// applyBatch writes one Txn of changes, each fenced on the key's
// ModRevision in the new cluster as read just before (the job is the only
// writer there before the switch: a failed compare is a read that raced
// the job's own earlier Txn of unknown outcome, read again).
func (j *job) applyBatch(ctx context.Context, i int, cs []change, absent bool) error {
	var need int64
	rels := make([]string, len(cs))
	for k, c := range cs {
		rels[k] = c.rel
		if c.kv != nil {
			need = max(need, c.kv.ModRevision)
		}
	}
	if err := j.raise(ctx, need); err != nil {
		return err
	}
	dm := j.dst.Moves()
	for attempt := 0; ; attempt++ {
		revs := map[string]int64{}
		if !absent || attempt > 0 {
			var err error
			if revs, err = dm.ReadRevisions(ctx, rels); err != nil {
				return err
			}
		}
		ws := make([]etcdstore.MoveWrite, 0, len(cs))
		for _, c := range cs {
			if c.kv == nil && revs[c.rel] == 0 {
				continue // deleted here already
			}
			ws = append(ws, etcdstore.MoveWrite{Rel: c.rel, Source: c.kv, Expect: revs[c.rel]})
		}
		if len(ws) == 0 {
			return nil
		}
		ok, rev, err := dm.Apply(ctx, j.claim, j.srcs[i].Namespace(), ws)
		if err != nil {
			return err
		}
		if ok {
			j.dstRev = max(j.dstRev, rev)
			j.counted(i, cs)
			return nil
		}
		select {
		case <-j.claim.Done():
			return fmt.Errorf("%w: the job's claim ended", ErrOtherMove)
		default:
		}
		if attempt == 9 {
			return authority.Wrap(authority.ErrUnavailable, "the new cluster's keys kept changing under the copy: is another process writing them?", nil)
		}
	}
}

// counted adds the changes of source i applied to the progress.
func (j *job) counted(i int, cs []change) {
	var rows int64
	for _, c := range cs {
		if c.row && c.kv != nil {
			rows++
		}
	}
	j.m.copied(rows, int64(len(cs)))
	j.mu.Lock()
	j.rec.Sources[i].Rows += rows
	j.rec.Sources[i].Keys += int64(len(cs))
	j.rate.add(rows)
	j.mu.Unlock()
}

// raise makes the new cluster's revision at least need, so that a copy of
// a key-value of ModRevision need is written at a revision above it: its
// StoreVersion, and every token and generation it holds, stay below every
// number the new cluster gives its later writes.
func (j *job) raise(ctx context.Context, need int64) error {
	if j.dstRev >= need {
		return nil
	}
	dm := j.dst.Moves()
	cur, err := dm.Revision(ctx)
	if err != nil {
		return err
	}
	j.dstRev = max(j.dstRev, cur)
	if cur >= need {
		return nil
	}
	if j.rec.Raised+need-cur > j.cfg.RaiseLimit {
		return authority.Wrap(authority.ErrInvalidArgument, fmt.Sprintf(
			"The new cluster's revision %d is %d below its sources' (%d raised already, RaiseLimit %d): create it with its revision raised (docs/operations.md, \"Adding a cluster\").",
			cur, need-cur, j.rec.Raised, j.cfg.RaiseLimit), nil)
	}
	j.at(fmt.Sprintf("raising the new cluster's revision from %d to %d", cur, need))
	reached, err := dm.Raise(ctx, need, j.cfg.RaiseParallel, nil)
	j.m.raised(reached - cur)
	j.rec.Raised += reached - cur
	j.dstRev = max(j.dstRev, reached)
	return err
}

// clearTarget deletes from the new cluster every moved or copied key that
// which selects (by its kind and row).
func (j *job) clearTarget(ctx context.Context, which func(schema.MoveKind, authority.Key) bool) error {
	dm := j.dst.Moves()
	after := ""
	for {
		kvs, _, more, err := dm.ListKeys(ctx, "", after, 0, 4*listPage)
		if err != nil {
			return err
		}
		var ws []etcdstore.MoveWrite
		for _, kv := range kvs {
			kind, row, _ := dm.KindOf(string(kv.Key))
			if kind != schema.MoveStays && which(kind, row) {
				ws = append(ws, etcdstore.MoveWrite{Rel: dm.Rel(string(kv.Key)), Expect: kv.ModRevision})
			}
		}
		for len(ws) > 0 {
			n := min(len(ws), j.cfg.Batch)
			if _, _, err := dm.Apply(ctx, j.claim, j.dst.Namespace(), ws[:n]); err != nil {
				return err
			}
			ws = ws[n:]
		}
		if !more || len(kvs) == 0 {
			return nil
		}
		after = dm.Rel(string(kvs[len(kvs)-1].Key))
	}
}

// sortedRels returns the keys of m in order.
func sortedRels[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

type kvT = mvccpb.KeyValue

// listAll reads every key-value of s under prefix (relative to its
// namespace), a page at a time, each page at the current revision.
func listAll(ctx context.Context, s *etcdstore.Store, prefix string, fn func([]*kvT) error) error {
	return listPages(ctx, s, prefix, false, fn)
}

// listKeys is listAll without the values.
func listKeys(ctx context.Context, s *etcdstore.Store, prefix string, fn func([]*kvT) error) error {
	return listPages(ctx, s, prefix, true, fn)
}

func listPages(ctx context.Context, s *etcdstore.Store, prefix string, keysOnly bool, fn func([]*kvT) error) error {
	list, page := s.Moves().List, listPage
	if keysOnly {
		list, page = s.Moves().ListKeys, 4*listPage
	}
	after := ""
	for {
		kvs, _, more, err := list(ctx, prefix, after, 0, page)
		if err != nil {
			return err
		}
		if err := fn(kvs); err != nil {
			return err
		}
		if !more || len(kvs) == 0 {
			return nil
		}
		after = s.Moves().Rel(string(kvs[len(kvs)-1].Key))
	}
}
