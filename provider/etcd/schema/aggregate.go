package schema

import (
	"bytes"
	"encoding/gob"
	"encoding/json"
	"time"

	authority "github.com/zlink-systems/authority"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// AggregateRecord is the stored state of one aggregate. A committed or
// aborted record keeps no participant payloads or membership mutations, and
// expires: it is kept on a bucketed lease and ignored once expired.
type AggregateRecord struct {
	// State is AggregatePrepared, AggregateCommitted or AggregateAborted.
	State string
	// Request is the request that prepared the aggregate.
	Request authority.AggregatePrepareRequest
	// ExpiresAt is when the store stops serving a committed or aborted
	// record; zero for a prepared one, which never expires, and for a
	// cross-shard one decided but not yet applied in every shard.
	ExpiresAt time.Time
	// Incarnation is set on the record of a cross-shard aggregate
	// (storeversion.RowLocks; package provider/sharded/twophase): a random
	// ID the prepare gives it, which the row locks of its commit name.
	// Empty on a record of one store, which older builds also read.
	Incarnation string
}

// Aggregate record states.
const (
	AggregatePrepared  = "prepared"
	AggregateCommitted = "committed"
	AggregateAborted   = "aborted"
)

// aggregateWire is an aggregate record of format 1 (after aggregateFormat1).
type aggregateWire struct {
	State      string            `json:"st"`
	ExpiresAt  time.Time         `json:"e"`
	ID         string            `json:"id"`
	Generation int64             `json:"g"`
	OwnerID    string            `json:"o"`
	Lease      int64             `json:"l"`
	Mesh       string            `json:"m"`
	RID        string            `json:"r"`
	Lifecycle  int64             `json:"lc"`
	Capacity   capacityWire      `json:"c"`
	Digest     []byte            `json:"d"`
	Parts      []participantWire `json:"p"`
	// Inc is a cross-shard record's incarnation (absent: a record of one
	// store).
	Inc string `json:"i,omitempty"`
}

// participantWire is one participant of an aggregate record.
type participantWire struct {
	Key        string `json:"k"`
	Version    string `json:"v"`
	Transition string `json:"t"`
	Payload    []byte `json:"pl,omitempty"`
	Mutation   []byte `json:"mm,omitempty"`
}

// Encode returns the stored value of a, in format 1.
func (a *AggregateRecord) Encode() string {
	b, _ := json.Marshal(a.wire())
	return aggregateFormat1 + string(b)
}

// wire is the record's format-1 wire form.
func (a *AggregateRecord) wire() *aggregateWire {
	r := &a.Request
	w := aggregateWire{State: a.State, ExpiresAt: a.ExpiresAt, ID: r.AggregateID, Generation: r.AggregateGeneration,
		OwnerID: r.TargetOwner.OwnerID, Lease: r.TargetOwner.LeaseGeneration, Mesh: r.TargetDescriptor.MeshName,
		RID: r.TargetDescriptor.RID, Lifecycle: r.TargetDescriptorLifecycleGeneration,
		Capacity: encodeCapacity(r.Capacity), Digest: r.InventoryDigest, Parts: make([]participantWire, len(r.Participants)), Inc: a.Incarnation}
	for i, p := range r.Participants {
		w.Parts[i] = participantWire{Key: string(p.AuthorityKey), Version: string(p.ExpectedStoreVersion),
			Transition: string(p.OwnerTransition), Payload: p.AuthorityPayload, Mutation: p.MembershipMutation}
	}
	return &w
}

// DecodeAggregate decodes an aggregate record of format 1, or of format 0
// (gob), strictly.
func DecodeAggregate(kv *mvccpb.KeyValue) (*AggregateRecord, error) {
	rest, ok := bytes.CutPrefix(kv.Value, []byte(aggregateFormat1))
	if !ok {
		return decodeAggregateV0(kv)
	}
	var w aggregateWire
	if err := decodeStrict(rest, &w); err != nil {
		return nil, corrupt(string(kv.Key), err)
	}
	if err := w.check(); err != nil {
		return nil, corrupt(string(kv.Key), err)
	}
	a := &AggregateRecord{State: w.State, ExpiresAt: w.ExpiresAt, Incarnation: w.Inc, Request: authority.AggregatePrepareRequest{
		AggregateID: w.ID, AggregateGeneration: w.Generation,
		TargetOwner:      authority.OwnerToken{OwnerID: w.OwnerID, LeaseGeneration: w.Lease},
		TargetDescriptor: authority.NodeDescriptor{MeshName: w.Mesh, RID: w.RID}, TargetDescriptorLifecycleGeneration: w.Lifecycle,
		Capacity: w.Capacity.vector(), InventoryDigest: w.Digest, Participants: make([]authority.AggregateParticipant, len(w.Parts)),
	}}
	for i, p := range w.Parts {
		a.Request.Participants[i] = authority.AggregateParticipant{AuthorityKey: authority.Key(p.Key),
			ExpectedStoreVersion: authority.StoreVersion(p.Version), OwnerTransition: authority.GenerationTransition(p.Transition),
			AuthorityPayload: p.Payload, MembershipMutation: p.Mutation}
	}
	return a, nil
}

// decodeAggregateV0 decodes a record of format 0 (gob), checked as strictly
// as one of format 1.
func decodeAggregateV0(kv *mvccpb.KeyValue) (*AggregateRecord, error) {
	var a AggregateRecord
	if err := gob.NewDecoder(bytes.NewReader(kv.Value)).Decode(&a); err != nil {
		return nil, corrupt(string(kv.Key), err)
	}
	if err := a.wire().check(); err != nil {
		return nil, corrupt(string(kv.Key), err)
	}
	return &a, nil
}
