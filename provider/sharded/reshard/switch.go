package reshard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded"
	"github.com/zlink-systems/authority/provider/sharded/twophase"
)

// switching freezes every source, applies their last changes, aborts the
// prepared aggregates of moving rows, copies the owner generations,
// covers capacity a source of one shard holds beyond its budget slices
// (trueup.go), decides the switch (the job record's one decision), and puts the next
// map in force in the new cluster, then in every source.
func (j *job) switching(ctx context.Context) error {
	if j.rec.Decision != schema.DecisionSwitch {
		if err := j.freeze(ctx); err != nil {
			return err
		}
		through, err := j.settleAggregates(ctx)
		if err != nil {
			return err
		}
		j.at("applying the last changes")
		err = j.follow(ctx, func(int64) (bool, error) {
			for i, st := range j.rec.Sources {
				if st.Applied < max(st.Frozen, through[i]) {
					return false, nil
				}
			}
			return true, nil
		})
		switch {
		case errors.Is(err, errRestart):
			return nil // copied again, still frozen: the phase runs again
		case errors.Is(err, errAbort):
			return nil
		case err != nil:
			return err
		}
		if err := j.copyOwnerGenerations(ctx); err != nil {
			return err
		}
		if err := j.trueUp(ctx); err != nil {
			return err
		}

		j.at("deciding the switch")
		j.rec.Decision = schema.DecisionSwitch
		if err := j.save(ctx); err != nil {
			return err
		}
		if j.rec.Decision != schema.DecisionSwitch {
			return nil // an abort was decided first
		}
	}
	j.at("switching the new cluster")
	if err := j.flip(ctx, j.dst, "the new cluster"); err != nil {
		return err
	}
	for i, s := range j.srcs {
		j.at(fmt.Sprintf("switching shard %d", i))
		if err := j.flip(ctx, s, fmt.Sprintf("shard %d", i)); err != nil {
			return err
		}
	}
	j.rec.Switched = time.Now().UTC()
	j.m.switched(j.frozeAt, j.rec.Switched)
	return j.next(ctx, schema.PhaseSwitched)
}

// freeze freezes every source not frozen yet, recording the revision of
// each freeze: the last at which a row that moves could change there.
func (j *job) freeze(ctx context.Context) error {
	for i, s := range j.srcs {
		st := &j.rec.Sources[i]
		if st.Frozen != 0 {
			continue
		}
		j.at(fmt.Sprintf("freezing shard %d", i))
		if j.frozeAt.IsZero() {
			j.frozeAt = time.Now()
		}
		k, err := s.Moves().ReadMap(ctx)
		if err != nil {
			return err
		}
		if k.Switching == nil {
			var ok bool
			if ok, k, err = s.Moves().Freeze(ctx, k); err != nil {
				return err
			}
			if !ok && k.Switching == nil {
				return fmt.Errorf("%w: shard %d could not be frozen (its map or pending move changed)", ErrOtherMove, i)
			}
		}
		if k.Switching.Job != j.rec.Move.Job {
			return fmt.Errorf("%w: shard %d is frozen for job %s", ErrOtherMove, i, k.Switching.Job)
		}
		st.Frozen = k.SwitchingRev
		if err := j.save(ctx); err != nil {
			return err
		}
	}
	return nil
}

// flip puts the next map in force in s (done already: nothing).
func (j *job) flip(ctx context.Context, s *etcdstore.Store, name string) error {
	k, err := s.Moves().ReadMap(ctx)
	if err != nil {
		return err
	}
	if k.Current != nil && k.Current.Epoch == j.rec.Move.To.Epoch {
		return nil
	}
	ok, k, err := s.Moves().Switch(ctx, k)
	if err != nil {
		return err
	}
	if !ok && (k.Current == nil || k.Current.Epoch != j.rec.Move.To.Epoch) {
		return fmt.Errorf("%w: %s could not switch to map epoch %d", ErrOtherMove, name, j.rec.Move.To.Epoch)
	}
	return nil
}

// fenceList is the prepared aggregates of moving rows, by source: their
// fences, and whether each was prepared across shards (its record has an
// incarnation).
type fenceList [][]preparedAggregate

type preparedAggregate struct {
	fence authority.Fence
	cross bool
}

func countFences(f fenceList) int {
	n := 0
	for _, l := range f {
		n += len(l)
	}
	return n
}

// movingAggregates lists, in each source, the prepared aggregates with a
// participant that moves: those of one shard in their shard, those across
// shards in their coordinator shard.
func (j *job) movingAggregates(ctx context.Context) (fenceList, error) {
	out := make(fenceList, len(j.srcs))
	from, to := len(j.rec.Move.From.Shards), len(j.rec.Move.To.Shards)
	for i, s := range j.srcs {
		err := listAll(ctx, s, schema.SegAggregates+"/", func(kvs []*kvT) error {
			for _, kv := range kvs {
				rec, err := schema.DecodeAggregate(kv)
				if err != nil {
					return err
				}
				if rec.State != schema.AggregatePrepared {
					continue
				}
				for _, p := range rec.Request.Participants {
					if sharded.Place(p.AuthorityKey, to) == from {
						out[i] = append(out[i], preparedAggregate{fence: rec.Request.Fence(), cross: rec.Incarnation != ""})
						break
					}
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("shard %d: %w", i, err)
		}
	}
	return out, nil
}

// abortAggregates aborts, in each frozen source, the prepared aggregates
// with a participant that moves (their commit could not apply once the
// rows left): one of a shard by its shard's store, one across shards
// through the two-phase protocol over the frozen sources (coord), each
// write fenced on its source's frozen map, as their coordinators' commits
// are.
func (j *job) abortAggregates(ctx context.Context, coord *twophase.Coordinator) error {
	prepared, err := j.movingAggregates(ctx)
	if err != nil {
		return err
	}
	for i, aggs := range prepared {
		for _, a := range aggs {
			f := a.fence
			j.at(fmt.Sprintf("aborting aggregate %s/%d of moving rows in shard %d", f.AggregateID, f.AggregateGeneration, i))
			if a.cross {
				_, err = coord.AbortAggregate(ctx, f)
			} else {
				_, err = j.srcs[i].AbortAggregate(etcdstore.WithShardMapRevision(ctx, j.rec.Sources[i].Frozen), f)
			}
			if err != nil {
				return fmt.Errorf("shard %d: aborting aggregate %s: %w", i, f.AggregateID, err)
			}
			j.m.abortedAggregate()
		}
	}
	return nil
}

// copyOwnerGenerations raises every owner generation key of the new
// cluster to the highest any source holds: an owner whose home moves
// there takes its next generation above every one handed out (the
// sources are frozen, and a lease is not taken in a frozen shard). A store
// taking a lease in the new cluster meanwhile (its generation is at most
// the sources') fails a compare: read again.
func (j *job) copyOwnerGenerations(ctx context.Context) error {
	j.at("copying owner generations")
	for attempt := 0; ; attempt++ {
		err := j.copyOwnerGenerationsOnce(ctx)
		if !errors.Is(err, ErrOtherMove) || attempt == 8 {
			return err
		}
		select {
		case <-j.claim.Done():
			return err
		default:
		}
	}
}

func (j *job) copyOwnerGenerationsOnce(ctx context.Context) error {
	want := map[string]int64{}
	for i, s := range j.srcs {
		if err := listAll(ctx, s, schema.SegOwnerGens+"/", func(kvs []*kvT) error {
			for _, kv := range kvs {
				g, err := schema.DecodeOwnerGeneration(kv)
				if err != nil {
					return err
				}
				rel := s.Moves().Rel(string(kv.Key))
				want[rel] = max(want[rel], g)
			}
			return nil
		}); err != nil {
			return fmt.Errorf("shard %d: %w", i, err)
		}
	}
	have := map[string]*kvT{}
	if err := listAll(ctx, j.dst, schema.SegOwnerGens+"/", func(kvs []*kvT) error {
		for _, kv := range kvs {
			have[j.dst.Moves().Rel(string(kv.Key))] = kv
		}
		return nil
	}); err != nil {
		return err
	}
	var ws []etcdstore.MoveWrite
	for _, rel := range sortedRels(want) {
		var expect, g int64
		if kv := have[rel]; kv != nil {
			var err error
			if g, err = schema.DecodeOwnerGeneration(kv); err != nil {
				return err
			}
			expect = kv.ModRevision
		}
		if g < want[rel] {
			v := schema.EncodeOwnerGeneration(want[rel])
			ws = append(ws, etcdstore.MoveWrite{Rel: rel, Raw: &v, Expect: expect})
		}
	}
	return j.applyRaw(ctx, ws)
}

// applyRaw writes ws into the new cluster, Batch at a time (a failed
// compare: the key changed under the job, ErrOtherMove).
func (j *job) applyRaw(ctx context.Context, ws []etcdstore.MoveWrite) error {
	for len(ws) > 0 {
		n := min(len(ws), j.cfg.Batch)
		ok, _, err := j.dst.Moves().Apply(ctx, j.claim, j.dst.Namespace(), ws[:n])
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: the new cluster's keys changed under the job (or its claim ended)", ErrOtherMove)
		}
		ws = ws[n:]
	}
	return nil
}

// missingLeases names the owner liveness keys live in a source but not in
// the new cluster.
func (j *job) missingLeases(ctx context.Context) ([]string, error) {
	live := map[string]bool{}
	for i, s := range j.srcs {
		if err := listKeys(ctx, s, schema.SegOwners+"/", func(kvs []*kvT) error {
			for _, kv := range kvs {
				live[s.Moves().Rel(string(kv.Key))] = true
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("shard %d: %w", i, err)
		}
	}
	if err := listKeys(ctx, j.dst, schema.SegOwners+"/", func(kvs []*kvT) error {
		for _, kv := range kvs {
			delete(live, j.dst.Moves().Rel(string(kv.Key)))
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return sortedRels(live), nil
}

// cleanup deletes from every source the keys of the rows it moved, fenced
// on the next map being in force there: the rows and owner index entries
// first, then the capacity entries with their budget (moveBudgets).
func (j *job) cleanup(ctx context.Context) error {
	mapRevs := make([]int64, len(j.srcs))
	for i, s := range j.srcs {
		j.at(fmt.Sprintf("deleting the moved keys from shard %d", i))
		k, err := s.Moves().ReadMap(ctx)
		if err != nil {
			return err
		}
		if k.Current == nil || k.Current.Epoch != j.rec.Move.To.Epoch {
			return fmt.Errorf("%w: shard %d is not at map epoch %d", ErrOtherMove, i, j.rec.Move.To.Epoch)
		}
		if err := listKeys(ctx, s, "", func(kvs []*kvT) error {
			var rels []string
			for _, kv := range kvs {
				// the keys that moved with their rows (the copied ones,
				// terminals and owner directory keys, stay too); capacity
				// entries and placement keys go with their budget
				// (budget.go)
				if kind, _, _ := s.Moves().KindOf(string(kv.Key)); kind != schema.MoveWithRow {
					continue
				}
				if c, ok := j.moving(i, kv, false); ok && !strings.HasPrefix(c.rel, schema.SegCapacity+"/") {
					rels = append(rels, c.rel)
				}
			}
			for len(rels) > 0 {
				n := min(len(rels), j.cfg.Batch)
				ok, err := s.Moves().DeleteMoved(ctx, k.CurrentRev, rels[:n])
				if err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("%w: shard %d's map moved while its moved keys were deleted", ErrOtherMove, i)
				}
				rels = rels[n:]
			}
			return nil
		}); err != nil {
			return fmt.Errorf("shard %d: %w", i, err)
		}
		mapRevs[i] = k.CurrentRev
	}
	if err := j.moveBudgets(ctx, mapRevs); err != nil {
		return err
	}
	return j.next(ctx, schema.PhaseDone)
}

// joinFirst joins the first n of names, and says how many more.
func joinFirst(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:n], ", ") + fmt.Sprintf(" and %d more", len(names)-n)
}
