package schema

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	authority "github.com/zlink-systems/authority"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// The keys and values of a resharding (package provider/sharded/reshard):
// growing a shard map by one cluster. They sit under SegShardMap beside the
// map itself ("current"):
//
//   - pending (every cluster of both maps): the move, from the map in force
//     to the next one, while its rows are copied; writers keep the map in
//     force and take owner leases in the new cluster;
//   - switching (the clusters of the map in force): the same move, once the
//     cluster is frozen for it: writes of the rows that move are refused
//     until the map in force is the next one;
//   - job and mover (the new cluster): the job's progress, and the lease-bound
//     claim of the one process running it;
//   - raise (the new cluster): a scratch key the job writes to raise the
//     cluster's revision above its sources' (docs/operations.md).

// ShardMapPrefix is the prefix of the shard map's keys.
func (l Layout) ShardMapPrefix() string { return l.ns + SegShardMap + "/" }

// ShardMovePending is the key of a move in progress.
func (l Layout) ShardMovePending() string { return l.ns + SegShardMap + "/pending" }

// ShardMoveSwitching is the key that freezes a cluster for a move.
func (l Layout) ShardMoveSwitching() string { return l.ns + SegShardMap + "/switching" }

// ReshardJob is the key of a move's job record.
func (l Layout) ReshardJob() string { return l.ns + SegShardMap + "/job" }

// ReshardMover is the key the process running a move holds (on its lease).
func (l Layout) ReshardMover() string { return l.ns + SegShardMap + "/mover" }

// ReshardRaise is the scratch key a move writes to raise the new cluster's
// revision.
func (l Layout) ReshardRaise() string { return l.ns + SegShardMap + "/raise" }

// ShardMove is a move from the map in force (From, epoch e) to the next map
// (To, epoch e+1: From's shards and one more cluster), made by job Job.
type ShardMove struct {
	Job      string
	From, To ShardMap
}

type shardMoveWire struct {
	J string       `json:"j"`
	F shardMapWire `json:"f"`
	T shardMapWire `json:"t"`
}

func (m ShardMap) wire() shardMapWire {
	w := shardMapWire{E: m.Epoch, H: m.Hash, S: make([]shardWire, len(m.Shards)), K: m.HomeShards, U: m.Raw}
	for i, s := range m.Shards {
		w.S[i] = shardWire{C: s.ClusterID, N: s.Namespace}
	}
	return w
}

func (w shardMapWire) shardMap() ShardMap {
	m := ShardMap{Epoch: w.E, Hash: w.H, Shards: make([]ShardMapShard, len(w.S)), HomeShards: w.K, Raw: w.U}
	for i, s := range w.S {
		m.Shards[i] = ShardMapShard{ClusterID: s.C, Namespace: s.N}
	}
	return m
}

// Check reports what makes m no move: a job that is not text, a map that
// is not storable, or a next map that is not the map in force with one
// more cluster, the same hash and the next epoch.
func (m ShardMove) Check() error {
	if err := storedText(m.Job, "resharding job ID"); err != nil {
		return err
	}
	if err := m.From.Check(); err != nil {
		return err
	}
	if err := m.To.Check(); err != nil {
		return err
	}
	if m.To.Epoch != m.From.Epoch+1 || m.To.Hash != m.From.Hash || len(m.To.Shards) != len(m.From.Shards)+1 {
		return fmt.Errorf("shard move from epoch %d (%d shards) to epoch %d (%d shards) does not add one shard at the next epoch",
			m.From.Epoch, len(m.From.Shards), m.To.Epoch, len(m.To.Shards))
	}
	for i, s := range m.From.Shards {
		if m.To.Shards[i] != s {
			return fmt.Errorf("shard move changes shard %d", i)
		}
	}
	if m.To.HomeShards != m.From.NextHomes() {
		return fmt.Errorf("shard move places home shards over %d shards, not the %d its map in force gives", m.To.HomeShards, m.From.NextHomes())
	}
	if m.To.Raw != m.From.NextRaw() {
		return fmt.Errorf("shard move numbers rows raw=%t, not raw=%t as its map in force gives", m.To.Raw, m.From.NextRaw())
	}
	return nil
}

// Encode returns the stored value of m.
func (m ShardMove) Encode() string {
	b, _ := json.Marshal(shardMoveWire{J: m.Job, F: m.From.wire(), T: m.To.wire()})
	return string(b)
}

// DecodeShardMove decodes a pending or switching key strictly.
func DecodeShardMove(kv *mvccpb.KeyValue) (ShardMove, error) {
	var w shardMoveWire
	if err := decodeStrict(kv.Value, &w); err != nil {
		return ShardMove{}, corrupt(string(kv.Key), err)
	}
	m := ShardMove{Job: w.J, From: w.F.shardMap(), To: w.T.shardMap()}
	if err := m.Check(); err != nil {
		return ShardMove{}, corrupt(string(kv.Key), err)
	}
	return m, nil
}

// Job phases, in order (ReshardJob.Phase).
const (
	PhaseCopying   = "copying"     // the rows that move are copied, source by source
	PhaseCatchUp   = "catching-up" // the copy follows its sources' changes
	PhaseSwitching = "switching"   // the sources are frozen; the last changes are applied
	PhaseSwitched  = "switched"    // the next map is in force; the moved keys are deleted from the sources
	PhaseDone      = "done"        // nothing is left to do
	PhaseAborting  = "aborting"    // the move is abandoned: the copies are deleted, the map in force stays
	PhaseAborted   = "aborted"     // nothing is left of the move
)

// Job decisions (ReshardJob.Decision): set once, never changed.
const (
	DecisionSwitch = "switch"
	DecisionAbort  = "abort"
)

var phases = []string{PhaseCopying, PhaseCatchUp, PhaseSwitching, PhaseSwitched, PhaseDone, PhaseAborting, PhaseAborted}

// ReshardJob is a move's job record: what it moves and how far it got.
type ReshardJob struct {
	// Move is the move (its Job is the record's ID).
	Move ShardMove
	// Phase is the step it is at (Phase*).
	Phase string
	// Decision is DecisionSwitch once the switch is decided, DecisionAbort
	// once an abort is: the one decision of the move.
	Decision string
	// Paused asks the process running it to stop at its next step.
	Paused bool
	// Sources is each source shard's progress (the map in force's order).
	Sources []ReshardSource
	// Raised is the revision the new cluster was raised to.
	Raised int64
	// Started and Updated are the times the job began and last wrote this
	// record; Switched the time the next map came into force.
	Started, Updated, Switched time.Time
	// Note says what the job waits for, or why it stopped ("" when
	// nothing).
	Note string
}

// ReshardSource is one source shard's progress.
type ReshardSource struct {
	// ListRev is the revision its rows are listed at (0: not yet).
	ListRev int64
	// After is the last key (relative to the namespace) copied from the
	// listing.
	After string
	// Listed says the listing was copied whole.
	Listed bool
	// Applied is the revision the copy holds every change through.
	Applied int64
	// Frozen is the revision of the Txn that froze it (0: not frozen).
	Frozen int64
	// Rows and Keys count the rows and keys copied from it.
	Rows, Keys int64
}

type reshardJobWire struct {
	M shardMoveWire    `json:"m"`
	P string           `json:"p"`
	D string           `json:"d,omitempty"`
	X bool             `json:"x,omitempty"`
	S []reshardSrcWire `json:"s"`
	R int64            `json:"r,omitempty"`
	T time.Time        `json:"t"`
	U time.Time        `json:"u"`
	W *time.Time       `json:"w,omitempty"`
	N string           `json:"n,omitempty"`
}

type reshardSrcWire struct {
	L int64  `json:"l,omitempty"`
	A string `json:"a,omitempty"`
	D bool   `json:"d,omitempty"`
	P int64  `json:"p,omitempty"`
	F int64  `json:"f,omitempty"`
	R int64  `json:"r,omitempty"`
	K int64  `json:"k,omitempty"`
}

// Encode returns the stored value of j.
func (j ReshardJob) Encode() string {
	w := reshardJobWire{M: shardMoveWire{J: j.Move.Job, F: j.Move.From.wire(), T: j.Move.To.wire()}, P: j.Phase, D: j.Decision,
		X: j.Paused, S: make([]reshardSrcWire, len(j.Sources)), R: j.Raised, T: j.Started, U: j.Updated, N: j.Note}
	if !j.Switched.IsZero() {
		w.W = &j.Switched
	}
	for i, s := range j.Sources {
		w.S[i] = reshardSrcWire{L: s.ListRev, A: s.After, D: s.Listed, P: s.Applied, F: s.Frozen, R: s.Rows, K: s.Keys}
	}
	b, _ := json.Marshal(w)
	return string(b)
}

var errBadJob = errors.New("resharding job record out of range")

// DecodeReshardJob decodes a job record strictly.
func DecodeReshardJob(kv *mvccpb.KeyValue) (ReshardJob, error) {
	var w reshardJobWire
	if err := decodeStrict(kv.Value, &w); err != nil {
		return ReshardJob{}, corrupt(string(kv.Key), err)
	}
	j := ReshardJob{Move: ShardMove{Job: w.M.J, From: w.M.F.shardMap(), To: w.M.T.shardMap()}, Phase: w.P, Decision: w.D,
		Paused: w.X, Sources: make([]ReshardSource, len(w.S)), Raised: w.R, Started: w.T, Updated: w.U, Note: w.N}
	if w.W != nil {
		j.Switched = *w.W
	}
	for i, s := range w.S {
		j.Sources[i] = ReshardSource{ListRev: s.L, After: s.A, Listed: s.D, Applied: s.P, Frozen: s.F, Rows: s.R, Keys: s.K}
	}
	if err := j.check(); err != nil {
		return ReshardJob{}, corrupt(string(kv.Key), err)
	}
	return j, nil
}

func (j ReshardJob) check() error {
	if err := j.Move.Check(); err != nil {
		return err
	}
	known := false
	for _, p := range phases {
		known = known || p == j.Phase
	}
	if !known || j.Decision != "" && j.Decision != DecisionSwitch && j.Decision != DecisionAbort ||
		len(j.Sources) != len(j.Move.From.Shards) || j.Raised < 0 {
		return errBadJob
	}
	for _, s := range j.Sources {
		if s.ListRev < 0 || s.Applied < 0 || s.Frozen < 0 || s.Rows < 0 || s.Keys < 0 {
			return errBadJob
		}
	}
	return nil
}

// MoveKind says what a resharding does with a key of a source namespace.
type MoveKind int

const (
	// MoveStays is a key of the namespace itself: owner liveness and
	// generations, store versions, the shard map, capacity epochs,
	// aggregate records and their capacity entries, relocation blobs.
	MoveStays MoveKind = iota
	// MoveWithRow is a key of one row, which goes where the row goes: the
	// row, its owner index entry, its capacity entry (or its placement
	// key, which is both).
	MoveWithRow
	// MoveCopied is a terminal (reservation or creation) or an owner
	// directory key: it names no row, so every one is copied into the new
	// shard and also stays.
	MoveCopied
	// MoveResolved is a row lock (SegRowLocks) of a cross-shard
	// aggregate's commit: never copied, it does not follow its row. The
	// switch resolves every lock of a moving row before the map switches
	// (the aggregate applied, or its lock released, through the two-phase
	// protocol over the frozen sources), so the rows move unlocked; the
	// aggregate's record, capacity parts and part markers stay where they
	// are (MoveStays: the record in its coordinator shard, which a growth
	// does not change; a part of a moving row's shard is released by the
	// abort of its prepared aggregate at the switch).
	MoveResolved
)

// MoveKindOf classifies key (a key of l's namespace): its kind, the row of
// a MoveWithRow key, and for a row's capacity entry the capacity epoch key
// of its node lifecycle (relative to the namespace), which every Txn that
// writes the entry also puts.
func (l Layout) MoveKindOf(key string) (kind MoveKind, row authority.Key, epoch string) {
	rest, ok := strings.CutPrefix(key, l.ns)
	if !ok {
		return MoveStays, "", ""
	}
	seg, tail, _ := strings.Cut(rest, "/")
	switch seg {
	case SegRows:
		return MoveWithRow, authority.Key(tail), ""
	case SegOwnerRows:
		if parts := strings.SplitN(tail, "/", 3); len(parts) == 3 {
			return MoveWithRow, authority.Key(parts[2]), ""
		}
	case SegCapacity:
		if parts := strings.SplitN(tail, "/", 5); len(parts) == 5 && parts[3] == capRow {
			return MoveWithRow, authority.Key(parts[4]), SegCapacityEpochs + "/" + strings.Join(parts[:3], "/")
		}
		// a placement key (storeversion.FewerKeys): the row's capacity
		// entry and owner index in one
		if parts := strings.SplitN(tail, "/", 7); len(parts) == 7 && parts[3] == capOwned {
			return MoveWithRow, authority.Key(parts[6]), SegCapacityEpochs + "/" + strings.Join(parts[:3], "/")
		}
	case SegReservations, SegTerminals, SegOwnerNodes:
		// an owner directory key names no row, but the placement keys it
		// lists may move: it is copied, as terminals are
		return MoveCopied, "", ""
	case SegRowLocks:
		return MoveResolved, authority.Key(tail), ""
	case SegAggregateParts:
		return MoveStays, "", ""
	}
	return MoveStays, "", ""
}

// decodeReshard decodes a key under SegShardMap other than the map itself.
func (e *Entry) decodeReshard(namespace string, kv *mvccpb.KeyValue) error {
	l := Layout{ns: namespace}
	switch string(kv.Key) {
	case l.ShardMovePending(), l.ShardMoveSwitching():
		m, err := DecodeShardMove(kv)
		if err != nil {
			return err
		}
		e.ShardMove = &m
	case l.ReshardJob():
		j, err := DecodeReshardJob(kv)
		if err != nil {
			return err
		}
		e.ReshardJob = &j
	case l.ReshardMover(), l.ReshardRaise():
		// a process's name, a scratch value
	default:
		return errBadKey
	}
	return nil
}
