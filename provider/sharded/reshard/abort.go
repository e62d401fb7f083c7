package reshard

import (
	"context"
	"fmt"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// abort undoes a move whose abort was decided (its switch was not): the
// pending move is deleted from every source (a frozen one unfrozen, its map
// put again so that the stores that saw it frozen route again) and from the
// new cluster, then everything the job wrote there is deleted. The map in
// force never changed, so nothing written through it is lost.
func (j *job) abort(ctx context.Context) error {
	if j.rec.Phase != schema.PhaseAborting {
		if err := j.next(ctx, schema.PhaseAborting); err != nil {
			return err
		}
	}
	for i, s := range append(append([]*etcdstore.Store(nil), j.srcs...), j.dst) {
		name := fmt.Sprintf("shard %d", i)
		if i == len(j.srcs) {
			name = "the new cluster"
		}
		j.at("undoing the pending move in " + name)
		k, err := s.Moves().ReadMap(ctx)
		if err != nil {
			return err
		}
		if k.Pending == nil || k.Pending.Job != j.rec.Move.Job {
			continue
		}
		ok, k, err := s.Moves().Undo(ctx, k)
		if err != nil {
			return err
		}
		if !ok && k.Pending != nil && k.Pending.Job == j.rec.Move.Job {
			return fmt.Errorf("%w: %s changed while its pending move was undone", ErrOtherMove, name)
		}
	}
	j.at("deleting the copies from the new cluster")
	if err := j.clearTarget(ctx, func(schema.MoveKind, authority.Key) bool { return true }); err != nil {
		return err
	}
	if err := j.clearSegments(ctx, schema.SegOwnerGens+"/", schema.SegCapacityEpochs+"/"); err != nil {
		return err
	}
	return j.next(ctx, schema.PhaseAborted)
}

// clearSegments deletes every key of the new cluster under the segment
// prefixes.
func (j *job) clearSegments(ctx context.Context, prefixes ...string) error {
	for _, p := range prefixes {
		var ws []etcdstore.MoveWrite
		if err := listKeys(ctx, j.dst, p, func(kvs []*kvT) error {
			for _, kv := range kvs {
				ws = append(ws, etcdstore.MoveWrite{Rel: j.dst.Moves().Rel(string(kv.Key)), Expect: kv.ModRevision})
			}
			return nil
		}); err != nil {
			return err
		}
		if err := j.applyRaw(ctx, ws); err != nil {
			return err
		}
	}
	return nil
}
