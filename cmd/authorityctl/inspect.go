package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/etcdpage"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// rangeAll reads every key under prefix at one revision, in pages (split
// further when a page of large values would exceed the client's receive
// limit).
func rangeAll(ctx context.Context, c *clientv3.Client, prefix string, opts ...clientv3.OpOption) ([]*mvccpb.KeyValue, int64, error) {
	return etcdpage.All(ctx, c, prefix, 0, 500, opts...)
}

// raw runs f with a dialled client under --command-timeout; when f found
// nothing (g.foundNothing), it warns if the namespace is empty.
func (g *globals) raw(cmd *cobra.Command, f func(ctx context.Context, c *clientv3.Client) error) error {
	ctx, cancel := g.commandContext(cmd.Context())
	defer cancel()
	c, _, err := g.dial(ctx, false)
	if err != nil {
		return err
	}
	defer c.Close()
	err = f(ctx, c)
	g.afterRead(ctx, c, err)
	return err
}

// withStore runs f with a store of the flags' cluster and namespace (and its
// client) under --command-timeout: a read-only store unless writes; when f
// found nothing, it warns if the namespace is empty.
func (g *globals) withStore(cmd *cobra.Command, writes bool, f func(ctx context.Context, s *etcdstore.Store, c *clientv3.Client) error) error {
	ctx, cancel := g.commandContext(cmd.Context())
	defer cancel()
	s, c, done, err := g.store(ctx, writes)
	if err != nil {
		return err
	}
	defer done()
	err = f(ctx, s, c)
	g.afterRead(ctx, c, err)
	return err
}

// afterRead warns when a command that found nothing read an empty
// namespace.
func (g *globals) afterRead(ctx context.Context, c *clientv3.Client, err error) {
	if g.foundNothing && (err == nil || errors.Is(err, errNotFound)) {
		g.warnIfEmpty(ctx, c)
	}
}

// ownerView is one live owner lease.
type ownerView struct {
	OwnerID             string `json:"ownerId"`
	LeaseGeneration     int64  `json:"leaseGeneration"`
	MeshName            string `json:"meshName"`
	NodeRID             string `json:"nodeRid"`
	LifecycleGeneration int64  `json:"lifecycleGeneration"`
	Rows                int64  `json:"rows"`
	LeaseID             string `json:"leaseId"`
	GrantedTTLSeconds   int64  `json:"grantedTtlSeconds"`
	TTLSeconds          int64  `json:"ttlSeconds"`
	ExpiresAt           string `json:"expiresAt"`
}

func newOwnersCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "owners",
		Short: "List live owner leases with the time they have left",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.raw(cmd, func(ctx context.Context, c *clientv3.Client) error {
				owners, err := listOwners(ctx, c, g.namespace, g.skipUndecodable)
				if err != nil {
					return err
				}
				return renderItems(g, owners, ownersTable(), (*table).addOwner)
			})
		},
	}
}

func listOwners(ctx context.Context, c *clientv3.Client, ns string, skip func(error)) ([]ownerView, error) {
	now := time.Now()
	return listEntries(ctx, c, ns, entryQuery{prefix: schema.Prefix(ns, schema.EntryOwnerLiveness), undecodable: skip}, func(le listedEntry) (ownerView, bool, error) {
		l, kv := le.entry, le.kv
		v := ownerView{OwnerID: l.Owner.OwnerID, LeaseGeneration: l.Owner.LeaseGeneration, MeshName: l.Node.MeshName, NodeRID: l.Node.RID,
			LifecycleGeneration: l.Lifecycle, LeaseID: fmt.Sprintf("%x", kv.Lease), TTLSeconds: -1}
		if kv.Lease != 0 {
			ttl, err := c.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
			if err != nil {
				return v, false, err
			}
			v.GrantedTTLSeconds, v.TTLSeconds = ttl.GrantedTTL, ttl.TTL
			if ttl.TTL >= 0 {
				v.ExpiresAt = rfc3339(now.Add(time.Duration(ttl.TTL) * time.Second))
			}
		}
		rows, err := ownerIndexCount(ctx, c, ns, l.Owner, le.rev)
		if err != nil {
			return v, false, err
		}
		v.Rows = rows
		return v, true, nil
	})
}

func ownersTable() *table {
	return &table{header: []string{"OWNER", "LEASE-GEN", "NODE", "ROWS", "TTL-LEFT"}, wide: []string{"LEASE-ID", "GRANTED-TTL"}}
}

func (t *table) addOwner(o ownerView) {
	left := "expired"
	if o.TTLSeconds >= 0 {
		left = age(time.Duration(o.TTLSeconds) * time.Second)
	}
	t.add(o.OwnerID, strconv.FormatInt(o.LeaseGeneration, 10), fmt.Sprintf("%s/%s@%d", o.MeshName, o.NodeRID, o.LifecycleGeneration),
		strconv.FormatInt(o.Rows, 10), left, o.LeaseID, age(time.Duration(o.GrantedTTLSeconds)*time.Second))
}

// capacityUsageView is the usage of one counter of one node lifecycle.
type capacityUsageView struct {
	MeshName            string `json:"meshName"`
	NodeRID             string `json:"nodeRid"`
	LifecycleGeneration int64  `json:"lifecycleGeneration"`
	// Counter is "actor", "spot" (all Spots) or "<spot kind>:<stable type>".
	Counter  string `json:"counter"`
	Active   int64  `json:"active"`
	Reserved int64  `json:"reserved"`
	// Holders is how many rows and aggregates hold capacity on this counter.
	Holders int `json:"holders"`
}

func newCapacityCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "capacity [NODE]",
		Short: "Show active and reserved capacity per node and Spot type (NODE: RID, MESH/RID or MESH/RID@LIFECYCLE)",
		Long: `Show the active and reserved capacity of each node lifecycle, per counter
(actor, spot, and each Spot type). NODE narrows it to one node: RID,
MESH/RID, or the MESH/RID@LIFECYCLE this command prints (LIFECYCLE is the
node's lifecycle generation: the scope of its rows, kept across a restart
that keeps them).`,
		Args: maxArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var filter nodeFilter
			if len(args) == 1 {
				f, err := parseNodeFilter(args[0])
				if err != nil {
					return err
				}
				filter = f
			}
			return g.raw(cmd, func(ctx context.Context, c *clientv3.Client) error {
				usage, err := capacityUsage(ctx, c, g.namespace, filter, g.skipUndecodable)
				if err != nil {
					return err
				}
				if filter.text != "" && len(usage) == 0 {
					g.foundNothing = true
					return fmt.Errorf("node %q holds no capacity: %w", filter.text, errNotFound)
				}
				return renderItems(g, usage, capacityTable(), (*table).addCapacityUsage)
			})
		},
	}
}

// nodeFilter is capacity's NODE argument: a RID, MESH/RID, or either with
// @LIFECYCLE.
type nodeFilter struct {
	text, mesh, rid string
	lifecycle       int64 // 0: any
}

func parseNodeFilter(s string) (nodeFilter, error) {
	f := nodeFilter{text: s}
	node, lc, hasLC := strings.Cut(s, "@")
	if hasLC {
		n, err := strconv.ParseInt(lc, 10, 64)
		if err != nil || n < 1 {
			return f, usageError(fmt.Errorf("NODE %q: the lifecycle after @ must be an integer >= 1", s))
		}
		f.lifecycle = n
	}
	if mesh, rid, ok := strings.Cut(node, "/"); ok {
		f.mesh, f.rid = mesh, rid
	} else {
		f.rid = node
	}
	if f.rid == "" {
		return f, usageError(fmt.Errorf("NODE %q names no node: want RID, MESH/RID or MESH/RID@LIFECYCLE", s))
	}
	return f, nil
}

func (f nodeFilter) matches(node authority.NodeDescriptor, lifecycle int64) bool {
	if f.text == "" {
		return true
	}
	return node.RID == f.rid && (f.mesh == "" || node.MeshName == f.mesh) && (f.lifecycle == 0 || lifecycle == f.lifecycle)
}

func capacityUsage(ctx context.Context, c *clientv3.Client, ns string, filter nodeFilter, skip func(error)) ([]capacityUsageView, error) {
	entries, err := listEntries(ctx, c, ns, entryQuery{prefix: schema.Prefix(ns, schema.EntryCapacity), undecodable: skip}, func(le listedEntry) (schema.Entry, bool, error) {
		return le.entry, filter.matches(le.entry.Node, le.entry.Lifecycle), nil
	})
	if err != nil {
		return nil, err
	}
	sums := map[authority.CapacityCounter]*capacityUsageView{}
	for _, k := range entries {
		for _, e := range authority.CapacityEntries(k.Node, k.Lifecycle, k.Capacity.Vector) {
			u := sums[e.Counter]
			if u == nil {
				name := string(e.Counter.ObjectKind)
				if e.Counter.StableType != "" {
					name += ":" + e.Counter.StableType
				}
				u = &capacityUsageView{MeshName: k.Node.MeshName, NodeRID: k.Node.RID, LifecycleGeneration: k.Lifecycle, Counter: name}
				sums[e.Counter] = u
			}
			if k.Capacity.State == authority.AllocationActive {
				u.Active += e.Count
			} else {
				u.Reserved += e.Count
			}
			u.Holders++
		}
	}
	out := make([]capacityUsageView, 0, len(sums))
	for _, u := range sums {
		out = append(out, *u)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.MeshName != b.MeshName {
			return a.MeshName < b.MeshName
		}
		if a.NodeRID != b.NodeRID {
			return a.NodeRID < b.NodeRID
		}
		if a.LifecycleGeneration != b.LifecycleGeneration {
			return a.LifecycleGeneration < b.LifecycleGeneration
		}
		return counterRank(a.Counter) < counterRank(b.Counter)
	})
	return out, nil
}

// counterRank orders the actor counter, the Spot counter, then Spot types.
func counterRank(c string) string {
	switch c {
	case string(authority.ObjectActor):
		return "0"
	case string(authority.CounterSpots):
		return "1"
	}
	return "2" + c
}

func capacityTable() *table {
	return &table{header: []string{"NODE", "COUNTER", "ACTIVE", "RESERVED"}, wide: []string{"HOLDERS"}}
}

func (t *table) addCapacityUsage(u capacityUsageView) {
	t.add(fmt.Sprintf("%s/%s@%d", u.MeshName, u.NodeRID, u.LifecycleGeneration), u.Counter,
		strconv.FormatInt(u.Active, 10), strconv.FormatInt(u.Reserved, 10), strconv.Itoa(u.Holders))
}

// terminalView is a creation terminal.
type terminalView struct {
	Operation            string `json:"operation"`
	SourceNodeRID        string `json:"sourceNodeRid"`
	SourceNodeGeneration int64  `json:"sourceNodeGeneration"`
	State                string `json:"state"`
	ObjectKind           string `json:"objectKind"`
	ReservationID        string `json:"reservationId"`
	EnvelopeSize         int    `json:"envelopeSize"`
	EnvelopeSHA256       string `json:"envelopeSha256"`
	PublishedAt          string `json:"publishedAt"`
	ExpiresAt            string `json:"expiresAt"`

	expiresIn string
}

func newTerminalsCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "terminals",
		Short: "List unexpired creation terminals (the outcomes of Actor creations)",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.raw(cmd, func(ctx context.Context, c *clientv3.Client) error {
				now := time.Now()
				out, err := listEntries(ctx, c, g.namespace, entryQuery{prefix: schema.Prefix(g.namespace, schema.EntryTerminal), undecodable: g.skipUndecodable}, func(le listedEntry) (terminalView, bool, error) {
					if le.entry.Expired(now) {
						return terminalView{}, false, nil // awaiting its lease
					}
					w := le.entry.Terminal
					return terminalView{Operation: w.Operation.Key(), SourceNodeRID: w.Operation.SourceNodeRID,
						SourceNodeGeneration: w.Operation.SourceNodeGeneration, State: string(w.State), ObjectKind: string(w.ObjectKind),
						ReservationID: w.ReservationID, EnvelopeSize: len(w.TerminalEnvelope), EnvelopeSHA256: hex.EncodeToString(w.TerminalEnvelopeSHA256),
						PublishedAt: rfc3339(w.StoreNow), ExpiresAt: rfc3339(w.ExpiresAt), expiresIn: until(w.ExpiresAt, now)}, true, nil
				})
				if err != nil {
					return err
				}
				t := &table{header: []string{"OPERATION", "STATE", "KIND", "RESERVATION", "EXPIRES-IN"}, wide: []string{"SOURCE", "ENVELOPE"}}
				return renderItems(g, out, t, func(t *table, v terminalView) {
					t.add(v.Operation, v.State, v.ObjectKind, v.ReservationID, v.expiresIn,
						fmt.Sprintf("%s@%d", v.SourceNodeRID, v.SourceNodeGeneration), fmt.Sprintf("%d bytes", v.EnvelopeSize))
				})
			})
		},
	}
}

// reservationView is a reservation terminal.
type reservationView struct {
	ReservationID string `json:"reservationId"`
	State         string `json:"state"`
	ExpiresAt     string `json:"expiresAt"`
	Revision      int64  `json:"revision"`

	expiresAt time.Time
}

func newReservationsCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "reservations",
		Short: "List reservation terminals (committed, rejected, failed, aborted reservations), oldest first",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.raw(cmd, func(ctx context.Context, c *clientv3.Client) error {
				now := time.Now()
				out, err := listEntries(ctx, c, g.namespace, entryQuery{prefix: schema.Prefix(g.namespace, schema.EntryReservation), undecodable: g.skipUndecodable}, func(le listedEntry) (reservationView, bool, error) {
					if le.entry.Expired(now) {
						return reservationView{}, false, nil
					}
					w := le.entry.Reservation
					return reservationView{ReservationID: le.entry.ReservationID, State: w.State, ExpiresAt: rfc3339(w.ExpiresAt),
						Revision: le.kv.ModRevision, expiresAt: w.ExpiresAt}, true, nil
				})
				if err != nil {
					return err
				}
				// in the order they finished
				sort.Slice(out, func(i, j int) bool { return out[i].Revision < out[j].Revision })
				t := &table{header: []string{"RESERVATION", "STATE", "EXPIRES-IN"}, wide: []string{"EXPIRES-AT", "REVISION"}}
				return renderItems(g, out, t, func(t *table, v reservationView) {
					t.add(v.ReservationID, v.State, until(v.expiresAt, now), v.ExpiresAt, strconv.FormatInt(v.Revision, 10))
				})
			})
		},
	}
}

// participantView is one row of an aggregate.
type participantView struct {
	Key                  string `json:"key"`
	ExpectedStoreVersion string `json:"expectedStoreVersion"`
	OwnerTransition      string `json:"ownerTransition"`
	// PayloadSize is the payload the commit writes, for a prepared record
	// only: a finished record keeps no payloads.
	PayloadSize *int `json:"payloadSize,omitempty"`
}

// aggregateView is an aggregate record.
type aggregateView struct {
	AggregateID               string            `json:"aggregateId"`
	Generation                int64             `json:"generation"`
	State                     string            `json:"state"`
	TargetOwnerID             string            `json:"targetOwnerId"`
	TargetLeaseGeneration     int64             `json:"targetLeaseGeneration"`
	TargetMeshName            string            `json:"targetMeshName"`
	TargetNodeRID             string            `json:"targetNodeRid"`
	TargetLifecycleGeneration int64             `json:"targetLifecycleGeneration"`
	Capacity                  capacityView      `json:"capacity"`
	InventoryDigest           string            `json:"inventoryDigest"`
	Participants              []participantView `json:"participants"`
	Revision                  int64             `json:"revision"`
}

func newAggregatesCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "aggregates",
		Short: "List unexpired aggregate records (prepared, committed, aborted)",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.raw(cmd, func(ctx context.Context, c *clientv3.Client) error {
				now := time.Now()
				out, err := listEntries(ctx, c, g.namespace, entryQuery{prefix: schema.Prefix(g.namespace, schema.EntryAggregate), undecodable: g.skipUndecodable}, func(le listedEntry) (aggregateView, bool, error) {
					if le.entry.Expired(now) {
						return aggregateView{}, false, nil // a finished record awaiting its lease
					}
					return viewAggregate(le.entry.Aggregate.Request, le.entry.Aggregate.State, le.kv.ModRevision), true, nil
				})
				if err != nil {
					return err
				}
				t := &table{header: []string{"AGGREGATE", "GEN", "STATE", "TARGET-OWNER", "TARGET-NODE", "PARTICIPANTS"},
					wide: []string{"CAPACITY", "REVISION"}}
				return renderItems(g, out, t, func(t *table, v aggregateView) {
					keys := make([]string, 0, len(v.Participants))
					for _, p := range v.Participants {
						keys = append(keys, p.Key)
					}
					t.add(v.AggregateID, strconv.FormatInt(v.Generation, 10), v.State,
						fmt.Sprintf("%s/%d", v.TargetOwnerID, v.TargetLeaseGeneration),
						fmt.Sprintf("%s/%s@%d", v.TargetMeshName, v.TargetNodeRID, v.TargetLifecycleGeneration),
						strings.Join(keys, ","), v.Capacity.String(), strconv.FormatInt(v.Revision, 10))
				})
			})
		},
	}
}

// viewAggregate is the view of an aggregate record in state, stored at
// revision.
func viewAggregate(r authority.AggregatePrepareRequest, state string, revision int64) aggregateView {
	v := aggregateView{AggregateID: r.AggregateID, Generation: r.AggregateGeneration, State: state,
		TargetOwnerID: r.TargetOwner.OwnerID, TargetLeaseGeneration: r.TargetOwner.LeaseGeneration,
		TargetMeshName: r.TargetDescriptor.MeshName, TargetNodeRID: r.TargetDescriptor.RID,
		TargetLifecycleGeneration: r.TargetDescriptorLifecycleGeneration, Capacity: viewCapacity(r.Capacity),
		InventoryDigest: hex.EncodeToString(r.InventoryDigest), Participants: []participantView{}, Revision: revision}
	for _, p := range r.Participants {
		pv := participantView{Key: string(p.AuthorityKey),
			ExpectedStoreVersion: string(p.ExpectedStoreVersion), OwnerTransition: string(p.OwnerTransition)}
		if state == "prepared" {
			size := len(p.AuthorityPayload)
			pv.PayloadSize = &size
		}
		v.Participants = append(v.Participants, pv)
	}
	return v
}
