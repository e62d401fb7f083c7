package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	authority "github.com/zlink-systems/authority"
	etcd "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/sharded"
	"github.com/zlink-systems/authority/provider/sharded/twophase"
)

// The committing process of the cross-shard aggregate test: a child process
// that opens a sharded store over the shard clusters, prepares one
// aggregate through the two-phase coordinator (package
// provider/sharded/twophase) and commits or aborts it, and kills itself
// (SIGKILL) at the step envShard2PCKill names.

// envShard2PCChild names the environment variable holding the child's
// configuration (JSON).
const envShard2PCChild = "FAULTS_SHARD_2PC_CHILD"

// envShard2PCKill names the step at which the child process dies:
// "before:<k>" (the k-th call to a shard's store, counted from 1 over the
// prepare and the commit or abort, is not sent; calls made at the same time
// may be in flight) or "after:<k>" (it returned); unset: never.
const envShard2PCKill = "FAULTS_SHARD_2PC_KILL"

// shard2PCTimeout bounds the child's operations and each of its requests.
const shard2PCTimeout = 20 * time.Second

// shard2PCConfig is what the test tells the child.
type shard2PCConfig struct {
	Endpoints [][]string                        `json:"endpoints"` // by shard
	Namespace string                            `json:"namespace"`
	Op        string                            `json:"op"` // "commit" or "abort"
	Request   authority.AggregatePrepareRequest `json:"request"`
}

// shard2PCLine is one line the child writes: "step" before a call is sent
// (and again, with Returned, after it returned; Err its error), "done" at
// the end of an operation it was not killed in.
type shard2PCLine struct {
	Event    string               `json:"event"`
	Step     int                  `json:"step,omitempty"`
	Call     string               `json:"call,omitempty"`
	Shard    int                  `json:"shard"`
	Returned bool                 `json:"returned,omitempty"`
	Prepare  authority.ResultKind `json:"prepare,omitempty"`
	Kind     authority.ResultKind `json:"kind,omitempty"`
	Err      string               `json:"err,omitempty"`
}

// shard2PCRouter places rows as the sharded store's map does and an
// aggregate's record in the shard its ID ends in ("…-c<shard>"): the test
// chooses it, so that every shard coordinates some aggregates.
type shard2PCRouter struct{ st *sharded.Store }

func (r shard2PCRouter) ShardOf(key authority.Key) int { return r.st.ShardOf(key) }

func (r shard2PCRouter) CoordinatorOf(id string) int {
	i := strings.LastIndex(id, "-c")
	if i < 0 {
		return 0
	}
	n, err := strconv.Atoi(id[i+2:])
	if err != nil || n < 0 || n >= r.st.Shards() {
		return 0
	}
	return n
}

func runShard2PCChildIfRequested() {
	runChildIfRequested(envShard2PCChild, "shard 2pc child", runShard2PCChild)
}

func runShard2PCChild(cfg shard2PCConfig) error {
	k, err := parseKillStep(os.Getenv(envShard2PCKill))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), shard2PCTimeout)
	defer cancel()
	scfg := sharded.Config{}
	for _, eps := range cfg.Endpoints {
		scfg.Shards = append(scfg.Shards, etcd.Config{Endpoints: eps, Namespace: cfg.Namespace, RequestTimeout: shard2PCTimeout, SkipVersionCheck: true})
	}
	st, err := sharded.New(ctx, scfg)
	if err != nil {
		return err
	}
	defer st.Close()
	k.out = json.NewEncoder(os.Stdout)
	shards := make([]twophase.Shard, st.Shards())
	for i := range shards {
		shards[i] = killShard{Shard: twophase.EtcdShard(st.Shard(i)), k: k, shard: i}
	}
	coord, err := twophase.New(shards, shard2PCRouter{st})
	if err != nil {
		return err
	}
	done := shard2PCLine{Event: "done"}
	prep, err := coord.PrepareAggregate(ctx, cfg.Request)
	done.Prepare = prep.Kind
	if err == nil && prep.Kind == authority.KindPrepared {
		if cfg.Op == "abort" {
			var res authority.AbortAggregateResult
			res, err = coord.AbortAggregate(ctx, cfg.Request.Fence())
			done.Kind = res.Kind
		} else {
			var res authority.CommitAggregateResult
			res, err = coord.CommitAggregate(ctx, cfg.Request.Fence())
			done.Kind = res.Kind
		}
	}
	if err != nil {
		done.Err = err.Error()
	}
	done.Step = k.count()
	k.emit(done)
	return nil
}

// killStep kills the process at its at-th call (0: never).
type killStep struct {
	after bool
	at    int
	mu    sync.Mutex
	steps int
	out   *json.Encoder
}

func parseKillStep(v string) (*killStep, error) {
	if v == "" {
		return &killStep{}, nil
	}
	mode, n, ok := strings.Cut(v, ":")
	at, err := strconv.Atoi(n)
	if !ok || err != nil || at < 1 || mode != "before" && mode != "after" {
		return nil, fmt.Errorf("%s=%q: want before:<k> or after:<k>, k ≥ 1", envShard2PCKill, v)
	}
	return &killStep{after: mode == "after", at: at}, nil
}

func (k *killStep) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.steps
}

func (k *killStep) emit(l shard2PCLine) {
	k.mu.Lock()
	defer k.mu.Unlock()
	_ = k.out.Encode(l) // one write to the pipe: the parent has it before the kill
}

// do runs one call to a shard's store, dying before or after it when it is
// the step named.
func (k *killStep) do(name string, shard int, call func() error) error {
	k.mu.Lock()
	k.steps++
	step := k.steps
	k.mu.Unlock()
	k.emit(shard2PCLine{Event: "step", Step: step, Call: name, Shard: shard})
	if step == k.at && !k.after {
		die()
	}
	err := call()
	l := shard2PCLine{Event: "step", Step: step, Call: name, Shard: shard, Returned: true}
	if err != nil {
		l.Err = err.Error()
	}
	k.emit(l)
	if step == k.at {
		die()
	}
	return err
}

// die kills the process as a crash would: no deferred call runs, no
// connection is closed in order.
func die() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// killShard is a shard whose every call goes through the kill step.
type killShard struct {
	twophase.Shard
	k     *killStep
	shard int
}

// viaKill runs call through k as the step name of shard s.
func viaKill[T any](s killShard, name string, call func() (T, error)) (T, error) {
	var out T
	err := s.k.do(name, s.shard, func() error {
		var err error
		out, err = call()
		return err
	})
	return out, err
}

// pair carries a call's two results through viaKill.
type pair[A, B any] struct {
	a A
	b B
}

func (s killShard) PrepareAggregate(ctx context.Context, req authority.AggregatePrepareRequest) (authority.PrepareAggregateResult, error) {
	return viaKill(s, "PrepareAggregate", func() (authority.PrepareAggregateResult, error) { return s.Shard.PrepareAggregate(ctx, req) })
}

func (s killShard) CommitAggregate(ctx context.Context, f authority.Fence) (authority.CommitAggregateResult, error) {
	return viaKill(s, "CommitAggregate", func() (authority.CommitAggregateResult, error) { return s.Shard.CommitAggregate(ctx, f) })
}

func (s killShard) AbortAggregate(ctx context.Context, f authority.Fence) (authority.AbortAggregateResult, error) {
	return viaKill(s, "AbortAggregate", func() (authority.AbortAggregateResult, error) { return s.Shard.AbortAggregate(ctx, f) })
}

func (s killShard) PrepareCrossShard(ctx context.Context, req authority.AggregatePrepareRequest, foreign []etcd.ParticipantCheck) (authority.PrepareAggregateResult, error) {
	return viaKill(s, "PrepareCrossShard", func() (authority.PrepareAggregateResult, error) { return s.Shard.PrepareCrossShard(ctx, req, foreign) })
}

func (s killShard) ReadRecord(ctx context.Context, f authority.Fence) (*etcd.CrossRecord, error) {
	return viaKill(s, "ReadRecord", func() (*etcd.CrossRecord, error) { return s.Shard.ReadRecord(ctx, f) })
}

func (s killShard) TakeOver(ctx context.Context, rec *etcd.CrossRecord) (*etcd.CrossRecord, bool, error) {
	p, err := viaKill(s, "TakeOver", func() (pair[*etcd.CrossRecord, bool], error) {
		r, ok, err := s.Shard.TakeOver(ctx, rec)
		return pair[*etcd.CrossRecord, bool]{r, ok}, err
	})
	return p.a, p.b, err
}

func (s killShard) Decide(ctx context.Context, rec *etcd.CrossRecord, commit bool) (*etcd.CrossRecord, bool, error) {
	p, err := viaKill(s, "Decide", func() (pair[*etcd.CrossRecord, bool], error) {
		r, ok, err := s.Shard.Decide(ctx, rec, commit)
		return pair[*etcd.CrossRecord, bool]{r, ok}, err
	})
	return p.a, p.b, err
}

func (s killShard) Finish(ctx context.Context, rec *etcd.CrossRecord) (*etcd.CrossRecord, error) {
	return viaKill(s, "Finish", func() (*etcd.CrossRecord, error) { return s.Shard.Finish(ctx, rec) })
}

func (s killShard) CheckParticipants(ctx context.Context, keys []authority.Key) ([]etcd.ParticipantCheck, error) {
	return viaKill(s, "CheckParticipants", func() ([]etcd.ParticipantCheck, error) { return s.Shard.CheckParticipants(ctx, keys) })
}

func (s killShard) LockParticipants(ctx context.Context, rec *etcd.CrossRecord, keys []authority.Key, att etcd.LockAttempt) (etcd.LockResult, error) {
	return viaKill(s, "LockParticipants", func() (etcd.LockResult, error) { return s.Shard.LockParticipants(ctx, rec, keys, att) })
}

func (s killShard) ApplyParticipants(ctx context.Context, rec *etcd.CrossRecord, keys []authority.Key) (map[authority.Key]int64, error) {
	return viaKill(s, "ApplyParticipants", func() (map[authority.Key]int64, error) { return s.Shard.ApplyParticipants(ctx, rec, keys) })
}

func (s killShard) ReleaseLocks(ctx context.Context, keys []authority.Key, sel etcd.LockSelector) (int, error) {
	return viaKill(s, "ReleaseLocks", func() (int, error) { return s.Shard.ReleaseLocks(ctx, keys, sel) })
}

func (s killShard) ReadLocked(ctx context.Context, key authority.Key) (authority.ReadResult, *etcd.RowLock, error) {
	p, err := viaKill(s, "ReadLocked", func() (pair[authority.ReadResult, *etcd.RowLock], error) {
		r, l, err := s.Shard.ReadLocked(ctx, key)
		return pair[authority.ReadResult, *etcd.RowLock]{r, l}, err
	})
	return p.a, p.b, err
}
