package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/coordinator"
	"github.com/zlink-systems/authority/internal/embedded"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/preflight"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The demo's cluster: two nodes of one mesh, each with its owner.
const (
	demoMesh       = "demo"
	demoSpotType   = "chat.Room"
	demoInstance   = "svc.Inventory"
	demoActorType  = "demo.Greeter"
	demoOwnerTTL   = time.Minute
	demoStepBudget = 30 * time.Second
)

var (
	demoNodeA = authority.NodeDescriptor{MeshName: demoMesh, RID: "node-a"}
	demoNodeB = authority.NodeDescriptor{MeshName: demoMesh, RID: "node-b"}
)

func newDemoCommand(g *globals) *cobra.Command {
	var dataDir, clientAddr string
	var serve, fsync bool
	var metricsAddr string
	cmd := &cobra.Command{
		Use:         "demo",
		Annotations: map[string]string{annotationWrites: "an embedded etcd of its own (not --endpoints)"},
		Short:       "Run the store on an embedded etcd, populate it, and show it",
		Long: `Start an embedded etcd (in a temporary directory, or --data-dir), register
two nodes with owner leases, create User Spots and Instance activations through
the coordinators and an Actor through the store, relocate two Spots to the
other node with an aggregate, then print the move (before → after: owner,
node, version, capacity), list, owners and capacity, a legend of their terms,
and the watch --rev 1 command that replays every change. With -o json or
-o yaml all of it is one document.

With --serve the server keeps running (the owner leases stay live) and its
endpoint is printed, so that another shell can run
  authorityctl --endpoints <endpoint> list -o json
until Ctrl-C. The connection flags other than --namespace are ignored.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := listenAddress("--listen", clientAddr); err != nil {
				return err
			}
			if err := listenAddress("--metrics-addr", metricsAddr); metricsAddr != "" && err != nil {
				return err
			}
			return runDemo(cmd.Context(), g, demoOptions{dataDir: dataDir, clientAddr: clientAddr, serve: serve, fsync: fsync, metricsAddr: metricsAddr})
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "etcd data directory (default: a temporary one, removed at exit)")
	cmd.Flags().StringVar(&clientAddr, "listen", embedded.DefaultClientAddr, "client address of the embedded etcd")
	cmd.Flags().BoolVar(&serve, "serve", false, "keep running and print the endpoint")
	cmd.Flags().BoolVar(&fsync, "fsync", false, "fsync etcd writes (slower, durable)")
	cmd.Flags().StringVar(&metricsAddr, "metrics-addr", "", "serve the demo store's Prometheus metrics on http://ADDR/metrics (for authorityctl top)")
	return cmd
}

type demoOptions struct {
	dataDir, clientAddr, metricsAddr string
	serve, fsync                     bool
}

func runDemo(ctx context.Context, g *globals, o demoOptions) error {
	progress := func(format string, args ...any) { fmt.Fprintf(g.stderr, "demo: "+format+"\n", args...) }
	progress("starting embedded etcd (%s)…", map[bool]string{true: o.dataDir, false: "temporary directory"}[o.dataDir != ""])
	sctx, cancel := context.WithTimeout(ctx, demoStepBudget)
	// the production limits the README asks for (and doctor checks); the
	// server's own log stays quiet: Start's error names what went wrong
	server, err := embedded.Start(sctx, embedded.Config{Dir: o.dataDir, ClientAddr: o.clientAddr, Fsync: o.fsync, LogOutput: io.Discard,
		MaxTxnOps: preflight.RecommendedMaxTxnOps, MaxRequestBytes: preflight.RecommendedMaxRequestBytes})
	cancel()
	if err != nil {
		return err
	}
	defer server.Close()
	endpoint := server.Endpoint()
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		MaxCallSendMsgSize: 4 * 1024 * 1024})
	if err != nil {
		return err
	}
	defer client.Close()
	reg, stopMetrics, err := serveDemoMetrics(o.metricsAddr, progress)
	if err != nil {
		return err
	}
	defer stopMetrics()
	store, err := etcdstore.New(ctx, etcdstore.Config{Client: client, Namespace: g.namespace, Registerer: reg})
	if err != nil {
		return err
	}
	defer store.Close()

	wctx, cancel := context.WithTimeout(ctx, demoStepBudget)
	leases, moves, err := populateDemo(wctx, store, progress)
	cancel()
	defer func() {
		for _, l := range leases {
			_ = l.Close(context.WithoutCancel(ctx))
		}
	}()
	if err != nil {
		return err
	}
	if err := showDemo(ctx, g, endpoint, moves, o.serve); err != nil {
		return err
	}
	if !o.serve {
		return nil
	}
	if g.output == outputTable || g.output == outputWide {
		fmt.Fprintf(g.stdout, "\nendpoint: %s\n", endpoint)
	}
	progress("serving on %s; Ctrl-C to stop", endpoint)
	<-ctx.Done()
	progress("stopping")
	return nil
}

// demoView is the demo's JSON/YAML document: what it moved, then what
// list, owners and capacity print (each as its own -o json document).
type demoView struct {
	Endpoint  string          `json:"endpoint"`
	Namespace string          `json:"namespace"`
	Moved     []moveView      `json:"moved"`
	Rows      json.RawMessage `json:"list"`
	Owners    json.RawMessage `json:"owners"`
	Capacity  json.RawMessage `json:"capacity"`
	// History is the command that replays every change the demo made.
	History string `json:"history"`
}

// showDemo prints what the demo did: the aggregate move as before → after,
// then list, owners and capacity as those commands print them (one document
// in json and yaml), a legend of the terms, and the command that shows the
// whole history.
func showDemo(ctx context.Context, g *globals, endpoint string, moves []moveView, serve bool) error {
	history := fmt.Sprintf("authorityctl --endpoints %s --namespace %s watch --rev 1", endpoint, g.namespace)
	sub := func(w io.Writer, format string, args ...string) error {
		all := append([]string{"--endpoints", endpoint, "--namespace", g.namespace, "-o", format}, args...)
		root := newRootCommand(w, g.stderr, nil)
		root.SetArgs(all)
		return root.ExecuteContext(ctx)
	}
	if g.output == outputJSON || g.output == outputYAML {
		v := demoView{Endpoint: endpoint, Namespace: g.namespace, Moved: moves, History: history}
		for _, c := range []struct {
			dst  *json.RawMessage
			args []string
		}{{&v.Rows, []string{"list"}}, {&v.Owners, []string{"owners"}}, {&v.Capacity, []string{"capacity"}}} {
			var buf bytes.Buffer
			if err := sub(&buf, outputJSON, c.args...); err != nil {
				return err
			}
			*c.dst = json.RawMessage(bytes.TrimSpace(buf.Bytes()))
		}
		return render(g.stdout, g.output, v, nil)
	}
	if len(moves) > 0 {
		fmt.Fprintf(g.stdout, "An aggregate moved %d User Spots from node-a to node-b in one etcd Txn (before → after):\n", len(moves))
		t := &table{header: []string{"KEY", "OWNER", "NODE", "VERSION", "CAPACITY"}}
		for _, m := range moves {
			t.add(m.Key, m.Before.Owner+" → "+m.After.Owner, m.Before.Node+" → "+m.After.Node,
				m.Before.StoreVersion+" → "+m.After.StoreVersion, m.After.Capacity)
		}
		if err := writeTable(g.stdout, t, false); err != nil {
			return err
		}
	}
	for _, c := range [][]string{{"list"}, {"owners"}, {"capacity"}} {
		fmt.Fprintf(g.stdout, "\n$ authorityctl %s\n", strings.Join(c, " "))
		if err := sub(g.stdout, g.output, c...); err != nil {
			return err
		}
	}
	var listed bytes.Buffer
	if err := sub(&listed, outputJSON, "list", "--all"); err != nil {
		return err
	}
	var rows listView
	if err := json.Unmarshal(listed.Bytes(), &rows); err != nil {
		return fmt.Errorf("reading the demo's rows: %w", err)
	}
	replay := "Every change above, in order (run it in another shell): "
	if !serve {
		replay = "Every change above, in order: run authorityctl demo --serve, then in another shell\n  "
	}
	fmt.Fprintf(g.stdout, "\n%s\n%s%s\n", demoLegend(rows.Items), replay, history)
	return nil
}

// demoLegend explains the terms of the demo's tables with the values of
// the first listed row (and of a row whose inbox is not replayed, if one
// is), so each example is one the table beside it shows.
func demoLegend(rows []rowView) string {
	var b strings.Builder
	term := func(name, value, meaning string) { fmt.Fprintf(&b, "  %-20s  %s\n", name+" "+value, meaning) }
	if len(rows) == 0 {
		b.WriteString("Reading the tables:\n")
	} else {
		r := rows[0]
		node := fmt.Sprintf("%s/%s@%d", r.MeshName, r.NodeRID, r.NodeLifecycleGeneration)
		fmt.Fprintf(&b, "Reading the tables (the examples are %s's):\n", r.Key)
		term("OWNER", fmt.Sprintf("%s/%d", r.OwnerID, r.OwnerLeaseGeneration),
			"owner ID / lease generation (a node's next owner lease gets the next generation)")
		term("TOKEN", strconv.FormatInt(r.OwnershipToken, 10), "the row's ownership token: what its owner fences its own writes with")
		term("NODE", node, "mesh / node RID @ lifecycle generation (the scope of the node's rows);")
		term("", "", fmt.Sprintf("%q takes it back", "authorityctl capacity "+node))
		term("VERSION", r.StoreVersion, "the row's store version: the etcd revision of its last write")
	}
	for _, r := range rows {
		if rec := r.Payload.Recovery; r.Payload.Codec == "coordinator" && rec != nil && rec.ReplayCursor < rec.InboxSequence {
			term("inbox replayed", fmt.Sprintf("%d/%d", rec.ReplayCursor, rec.InboxSequence), fmt.Sprintf(
				"an Instance activation whose recovery inbox is replayed up to message %d of %d (%s)",
				rec.ReplayCursor, rec.InboxSequence, r.Key))
			break
		}
	}
	term("capacity", "", "what each node holds per counter: actors, all Spots, and each Spot type")
	return strings.TrimSuffix(b.String(), "\n")
}

// moveView is one row an aggregate moved, before and after.
type moveView struct {
	Key    string        `json:"key"`
	Before placementView `json:"before"`
	After  placementView `json:"after"`
}

// placementView is where a row is placed: its owner, node and capacity.
type placementView struct {
	Owner        string `json:"owner"`
	Node         string `json:"node"`
	StoreVersion string `json:"storeVersion"`
	Capacity     string `json:"capacity"`
}

func placementOf(s *authority.Snapshot) placementView {
	a := s.Allocation
	return placementView{Owner: fmt.Sprintf("%s/%d", s.OwnerID, s.OwnerLeaseGeneration),
		Node:         fmt.Sprintf("%s/%s@%d", a.Descriptor.MeshName, a.Descriptor.RID, a.DescriptorLifecycleGeneration),
		StoreVersion: string(s.StoreVersion), Capacity: viewCapacity(a.Capacity).String()}
}

// populateDemo runs the demo's workload on an empty store; on a store that
// already holds rows (a reused --data-dir) it does nothing. It returns the
// owner leases it acquired.
func populateDemo(ctx context.Context, s *etcdstore.Store, progress func(string, ...any)) ([]*etcdstore.OwnerLease, []moveView, error) {
	existing, err := s.ListAuthorities(ctx, "", "", 1)
	if err != nil {
		return nil, nil, err
	}
	if len(existing.Items) > 0 {
		progress("the store already holds rows; showing them as they are")
		return nil, nil, nil
	}
	leases, err := populateDemoRows(ctx, s, progress)
	if err != nil {
		return leases, nil, err
	}
	progress("relocating room-1 and room-2 from node-a to node-b with an aggregate…")
	moves, err := demoRelocate(ctx, s, leases[1].Token(), "room-1", "room-2")
	return leases, moves, err
}

// populateDemoRows registers the two nodes and creates the demo's rows.
func populateDemoRows(ctx context.Context, s *etcdstore.Store, progress func(string, ...any)) ([]*etcdstore.OwnerLease, error) {
	progress("registering node-a and node-b with owner leases…")
	reg := s.Registry()
	leaseA, err := reg.Acquire(ctx, demoNodeA, 1, "owner-a", demoOwnerTTL)
	if err != nil {
		return nil, err
	}
	leases := []*etcdstore.OwnerLease{leaseA}
	leaseB, err := reg.Acquire(ctx, demoNodeB, 1, "owner-b", demoOwnerTTL)
	if err != nil {
		return leases, err
	}
	leases = append(leases, leaseB)
	ownerA, ownerB := leaseA.Token(), leaseB.Token()

	progress("creating User Spots room-1..room-4 through the User Spot coordinators…")
	if err := demoUserSpots(ctx, s, ownerA, ownerB); err != nil {
		return leases, err
	}
	progress("activating Instance Spots inventory-1 (completed) and inventory-2 (committed, inbox not replayed)…")
	if err := demoInstances(ctx, s, ownerB); err != nil {
		return leases, err
	}
	progress("creating Actor greeter-1 (reserve → completeCreation, publishing its terminal)…")
	if err := demoActor(ctx, s, ownerA); err != nil {
		return leases, err
	}

	return leases, nil
}

// demoUserSpots creates User Spots room-1..room-3 on node-a and room-4 on
// node-b through User Spot coordinators.
func demoUserSpots(ctx context.Context, s *etcdstore.Store, ownerA, ownerB authority.OwnerToken) error {
	spots := []struct {
		id    string
		node  authority.NodeDescriptor
		owner authority.OwnerToken
	}{{"room-1", demoNodeA, ownerA}, {"room-2", demoNodeA, ownerA}, {"room-3", demoNodeA, ownerA}, {"room-4", demoNodeB, ownerB}}
	for _, sp := range spots {
		target := coordinator.Target{MeshName: sp.node.MeshName, NodeRID: sp.node.RID, NodeGeneration: 1, Owner: sp.owner, IsLocal: true}
		c, err := coordinator.NewUserSpotCoordinator(coordinator.UserSpotOptions{
			Store: s, NodeRID: sp.node.RID, NodeGeneration: 1,
			Placement: func(context.Context, coordinator.CreateRequest, map[string]bool) (coordinator.Target, bool, error) {
				return target, true, nil
			},
		})
		if err != nil {
			return err
		}
		res, err := c.GetOrCreate(ctx, coordinator.CreateRequest{SpotID: sp.id, StableType: demoSpotType, RequestPayload: []byte("open " + sp.id), Timeout: demoStepBudget},
			func(context.Context, coordinator.Target, *authority.Snapshot) (coordinator.Materialized, error) {
				return coordinator.Materialized{State: coordinator.Created, Reply: []byte("welcome to " + sp.id)}, nil
			}, func(context.Context) error { return nil })
		if err != nil {
			return fmt.Errorf("create %s: %w", sp.id, err)
		}
		if res.State != coordinator.Created {
			return fmt.Errorf("create %s: %s", sp.id, res.State)
		}
	}
	return nil
}

// demoInstances activates Instance Spots inventory-1 (completed) and
// inventory-2 (committed, its inbox not replayed) on node-b.
func demoInstances(ctx context.Context, s *etcdstore.Store, ownerB authority.OwnerToken) error {
	inst, err := coordinator.NewInstanceActivationAuthority(coordinator.InstanceOptions{
		Store: s, Relocation: s.Relocation(), MeshName: demoMesh,
		Owner: func() (authority.OwnerToken, bool) { return ownerB, true },
	})
	if err != nil {
		return err
	}
	for _, id := range []string{"inventory-1", "inventory-2"} {
		target := coordinator.ActivationTarget{TargetSpotID: id, StableType: demoInstance, TargetNodeRID: demoNodeB.RID, TargetNodeGeneration: 1}
		deadline, ok := ctx.Deadline()
		if !ok {
			deadline = time.Now().Add(demoStepBudget)
		}
		out, err := inst.Reserve(ctx, coordinator.Activation{Target: target, Deadline: deadline, Request: []byte("activate " + id)})
		if err != nil {
			return fmt.Errorf("activate %s: %w", id, err)
		}
		if out.Kind != coordinator.ReserveReserved {
			return fmt.Errorf("activate %s: %s", id, out.Kind)
		}
		r := out.Reservation
		committed, err := inst.Commit(ctx, target, r, coordinator.ActivatedSpot{StableType: demoInstance, SpotID: id,
			Generation: r.Attempt, AuthorityOwnerGeneration: r.AuthorityOwnerGeneration})
		if err != nil {
			return fmt.Errorf("commit %s: %w", id, err)
		}
		if id == "inventory-1" {
			if _, err := inst.Complete(ctx, target, committed.Route); err != nil {
				return fmt.Errorf("complete %s: %w", id, err)
			}
		}
	}
	return nil
}

func demoActor(ctx context.Context, s *etcdstore.Store, owner authority.OwnerToken) error {
	request := []byte("greet the world")
	sum := sha256.Sum256(request)
	target := authority.CreationTarget{MeshName: demoMesh, NodeRID: demoNodeA.RID, NodeLifecycleGeneration: 1, Owner: owner}
	key := authority.ObjectKey{Kind: authority.ObjectActor, GlobalID: "greeter-1"}
	res, err := s.Reserve(ctx, authority.ReserveRequest{
		Key: key,
		Intent: authority.CreationIntent{StableType: demoActorType, RequestContentReference: coordinator.EncodeContentReference(request),
			RequestSHA256: sum[:], RequestEncodedSize: int64(len(request))},
		Target: target, CreatingPayload: []byte("creating"), Capacity: authority.CapacityVector{Actors: 1},
	})
	if err != nil {
		return err
	}
	if res.Kind != authority.KindReserved {
		return fmt.Errorf("reserve greeter-1: %s", res.Kind)
	}
	envelope := []byte("created greeter-1")
	envSum := sha256.Sum256(envelope)
	done, err := s.CompleteCreation(ctx, authority.CompleteCreationRequest{
		Key: key, ReservationID: res.ReservationID, ExpectedStoreVersion: res.Creating.StoreVersion, Target: target,
		Completion: authority.Completion{Kind: authority.TerminalCreated, ReadyPayload: []byte("hello from greeter-1"),
			Terminal: &authority.TerminalPublication{
				Operation:        authority.CreationOperation{SourceNodeRID: demoNodeA.RID, SourceNodeGeneration: 1, OperationID: authority.CreationOperationID{High: 1, Low: 1}},
				TerminalEnvelope: envelope, TerminalEnvelopeSHA256: envSum[:], OperationDeadline: time.Now().Add(time.Hour),
			}},
	})
	if err != nil {
		return err
	}
	if done.Kind != authority.KindCreated {
		return fmt.Errorf("complete greeter-1: %s", done.Kind)
	}
	return nil
}

// demoRelocate moves User Spots to target's node in one aggregate, rewriting
// their payloads' owner fields.
func demoRelocate(ctx context.Context, s *etcdstore.Store, target authority.OwnerToken, ids ...string) ([]moveView, error) {
	var moves []moveView
	req := authority.AggregatePrepareRequest{
		AggregateID: "relocate-node-a", AggregateGeneration: 1, TargetOwner: target,
		TargetDescriptor: demoNodeB, TargetDescriptorLifecycleGeneration: 1,
	}
	digest := sha256.New()
	var keys []authority.Key
	for _, id := range ids {
		key, err := authority.EncodeKey(authority.ObjectUserSpot, id)
		if err != nil {
			return nil, err
		}
		r, err := s.ReadAuthority(ctx, key)
		if err != nil {
			return nil, err
		}
		if r.Kind != authority.KindSnapshot {
			return nil, fmt.Errorf("relocate %s: %s", id, r.Kind)
		}
		p, err := coordinator.DecodePayload(r.Snapshot.Payload)
		if err != nil {
			return nil, err
		}
		p.OwnerID, p.OwnerLeaseGeneration = target.OwnerID, target.LeaseGeneration
		p.OwnerMeshName, p.OwnerNodeRID, p.OwnerNodeGeneration = demoNodeB.MeshName, demoNodeB.RID, 1
		payload, err := coordinator.EncodeUserSpotPayload(p)
		if err != nil {
			return nil, err
		}
		if req.Capacity, err = authority.AddCapacity(req.Capacity, r.Snapshot.Allocation.Capacity); err != nil {
			return nil, err
		}
		req.Participants = append(req.Participants, authority.AggregateParticipant{
			AuthorityKey: key, ExpectedStoreVersion: r.Snapshot.StoreVersion,
			OwnerTransition: authority.TransitionNewOwner, AuthorityPayload: payload,
		})
		digest.Write([]byte(key))
		keys = append(keys, key)
		moves = append(moves, moveView{Key: string(key), Before: placementOf(r.Snapshot)})
	}
	req.InventoryDigest = digest.Sum(nil)
	prep, err := s.PrepareAggregate(ctx, req)
	if err != nil {
		return nil, err
	}
	if prep.Kind != authority.KindPrepared {
		return nil, fmt.Errorf("prepare aggregate: %s", prep.Kind)
	}
	com, err := s.CommitAggregate(ctx, prep.Fence)
	if err != nil {
		return nil, err
	}
	if com.Kind != authority.KindCommitted {
		return nil, errors.New("commit aggregate: " + string(com.Kind))
	}
	for i, key := range keys {
		r, err := s.ReadAuthority(ctx, key)
		if err != nil {
			return nil, err
		}
		if r.Kind != authority.KindSnapshot {
			return nil, fmt.Errorf("relocated %s: %s", key, r.Kind)
		}
		moves[i].After = placementOf(r.Snapshot)
	}
	return moves, nil
}

// serveDemoMetrics serves a new registry's metrics on http://addr/metrics
// ("": none; the registry is then nil) until stop.
// listenAddress checks that addr is host:port with a numeric port (a usage
// error otherwise); whether it can be listened on is found when it is.
func listenAddress(flag, addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		var n int
		if n, err = strconv.Atoi(port); err == nil && (n < 0 || n > 65535) {
			err = errors.New("port out of range 0..65535")
		}
	}
	if err != nil {
		return usageError(fmt.Errorf("%s %q is not host:port: %w", flag, addr, err))
	}
	return nil
}

func serveDemoMetrics(addr string, progress func(string, ...any)) (reg prometheus.Registerer, stop func(), err error) {
	if addr == "" {
		return nil, func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--metrics-addr %s: %w", addr, err) // busy or not allowed: not a usage error
	}
	r := prometheus.NewRegistry()
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(r, promhttp.HandlerOpts{Registry: r}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	progress("metrics on http://%s/metrics", ln.Addr())
	return r, func() { _ = srv.Close() }, nil
}
