package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/coordinator"
	"github.com/zlink-systems/authority/internal/embedded"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
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
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the store on an embedded etcd, populate it, and show it",
		Long: `Start an embedded etcd (in a temporary directory, or --data-dir), register
two nodes with owner leases, create User Spots and Instance activations through
the coordinators and an Actor through the store, relocate two Spots to the
other node with an aggregate, then print list, owners and capacity.

With --serve the server keeps running (the owner leases stay live) and its
endpoint is printed, so that another shell can run
  authorityctl --endpoints <endpoint> list -o json
until Ctrl-C. The connection flags other than --namespace are ignored.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), g, demoOptions{dataDir: dataDir, clientAddr: clientAddr, serve: serve, fsync: fsync})
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "etcd data directory (default: a temporary one, removed at exit)")
	cmd.Flags().StringVar(&clientAddr, "listen", embedded.DefaultClientAddr, "client address of the embedded etcd")
	cmd.Flags().BoolVar(&serve, "serve", false, "keep running and print the endpoint")
	cmd.Flags().BoolVar(&fsync, "fsync", false, "fsync etcd writes (slower, durable)")
	return cmd
}

type demoOptions struct {
	dataDir, clientAddr string
	serve, fsync        bool
}

func runDemo(ctx context.Context, g *globals, o demoOptions) error {
	progress := func(format string, args ...any) { fmt.Fprintf(g.stderr, "demo: "+format+"\n", args...) }
	progress("starting embedded etcd (%s)…", map[bool]string{true: o.dataDir, false: "temporary directory"}[o.dataDir != ""])
	sctx, cancel := context.WithTimeout(ctx, demoStepBudget)
	server, err := embedded.Start(sctx, embedded.Config{Dir: o.dataDir, ClientAddr: o.clientAddr, Fsync: o.fsync, LogOutput: g.stderr})
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
	store, err := etcdstore.New(ctx, etcdstore.Config{Client: client, Namespace: g.namespace})
	if err != nil {
		return err
	}
	defer store.Close()

	wctx, cancel := context.WithTimeout(ctx, demoStepBudget)
	leases, err := populateDemo(wctx, store, progress)
	cancel()
	defer func() {
		for _, l := range leases {
			_ = l.Close(context.WithoutCancel(ctx))
		}
	}()
	if err != nil {
		return err
	}

	show := func(args ...string) error {
		fmt.Fprintf(g.stdout, "\n$ authorityctl %s\n", joinArgs(args))
		all := append([]string{"--endpoints", endpoint, "--namespace", g.namespace, "-o", g.output}, args...)
		root := newRootCommand(g.stdout, g.stderr, nil)
		root.SetArgs(all)
		return root.ExecuteContext(ctx)
	}
	for _, c := range [][]string{{"list"}, {"owners"}, {"capacity"}} {
		if err := show(c...); err != nil {
			return err
		}
	}
	if !o.serve {
		return nil
	}
	fmt.Fprintf(g.stdout, "\nendpoint: %s\n", endpoint)
	fmt.Fprintf(g.stdout, "try: authorityctl --endpoints %s list -o json\n", endpoint)
	progress("serving on %s; Ctrl-C to stop", endpoint)
	<-ctx.Done()
	progress("stopping")
	return nil
}

func joinArgs(args []string) string {
	s := ""
	for i, a := range args {
		if i > 0 {
			s += " "
		}
		s += a
	}
	return s
}

// populateDemo runs the demo's workload on an empty store; on a store that
// already holds rows (a reused --data-dir) it does nothing. It returns the
// owner leases it acquired.
func populateDemo(ctx context.Context, s *etcdstore.Store, progress func(string, ...any)) ([]*etcdstore.OwnerLease, error) {
	existing, err := s.ListAuthorities(ctx, "", "", 1)
	if err != nil {
		return nil, err
	}
	if len(existing.Items) > 0 {
		progress("the store already holds rows; showing them as they are")
		return nil, nil
	}
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
			return leases, err
		}
		res, err := c.GetOrCreate(ctx, coordinator.CreateRequest{SpotID: sp.id, StableType: demoSpotType, RequestPayload: []byte("open " + sp.id), Timeout: demoStepBudget},
			func(context.Context, coordinator.Target, *authority.Snapshot) (coordinator.Materialized, error) {
				return coordinator.Materialized{State: coordinator.Created, Reply: []byte("welcome to " + sp.id)}, nil
			}, func(context.Context) error { return nil })
		if err != nil {
			return leases, fmt.Errorf("create %s: %w", sp.id, err)
		}
		if res.State != coordinator.Created {
			return leases, fmt.Errorf("create %s: %s", sp.id, res.State)
		}
	}

	progress("activating Instance Spots inventory-1 (completed) and inventory-2 (committed, inbox not replayed)…")
	inst, err := coordinator.NewInstanceActivationAuthority(coordinator.InstanceOptions{
		Store: s, Relocation: s.Relocation(), MeshName: demoMesh,
		Owner: func() (authority.OwnerToken, bool) { return ownerB, true },
	})
	if err != nil {
		return leases, err
	}
	for _, id := range []string{"inventory-1", "inventory-2"} {
		target := coordinator.ActivationTarget{TargetSpotID: id, StableType: demoInstance, TargetNodeRID: demoNodeB.RID, TargetNodeGeneration: 1}
		deadline, ok := ctx.Deadline()
		if !ok {
			deadline = time.Now().Add(demoStepBudget)
		}
		out, err := inst.Reserve(ctx, coordinator.Activation{Target: target, Deadline: deadline, Request: []byte("activate " + id)})
		if err != nil {
			return leases, fmt.Errorf("activate %s: %w", id, err)
		}
		if out.Kind != coordinator.ReserveReserved {
			return leases, fmt.Errorf("activate %s: %s", id, out.Kind)
		}
		r := out.Reservation
		committed, err := inst.Commit(ctx, target, r, coordinator.ActivatedSpot{StableType: demoInstance, SpotID: id,
			Generation: r.Attempt, AuthorityOwnerGeneration: r.AuthorityOwnerGeneration})
		if err != nil {
			return leases, fmt.Errorf("commit %s: %w", id, err)
		}
		if id == "inventory-1" {
			if _, err := inst.Complete(ctx, target, committed.Route); err != nil {
				return leases, fmt.Errorf("complete %s: %w", id, err)
			}
		}
	}

	progress("creating Actor greeter-1 (reserve → completeCreation, publishing its terminal)…")
	if err := demoActor(ctx, s, ownerA); err != nil {
		return leases, err
	}

	progress("relocating room-1 and room-2 from node-a to node-b with an aggregate…")
	if err := demoRelocate(ctx, s, ownerB, "room-1", "room-2"); err != nil {
		return leases, err
	}
	return leases, nil
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
func demoRelocate(ctx context.Context, s *etcdstore.Store, target authority.OwnerToken, ids ...string) error {
	req := authority.AggregatePrepareRequest{
		AggregateID: "relocate-node-a", AggregateGeneration: 1, TargetOwner: target,
		TargetDescriptor: demoNodeB, TargetDescriptorLifecycleGeneration: 1,
	}
	digest := sha256.New()
	for _, id := range ids {
		key, err := authority.EncodeKey(authority.ObjectUserSpot, id)
		if err != nil {
			return err
		}
		r, err := s.ReadAuthority(ctx, key)
		if err != nil {
			return err
		}
		if r.Kind != authority.KindSnapshot {
			return fmt.Errorf("relocate %s: %s", id, r.Kind)
		}
		p, err := coordinator.DecodePayload(r.Snapshot.Payload)
		if err != nil {
			return err
		}
		p.OwnerID, p.OwnerLeaseGeneration = target.OwnerID, target.LeaseGeneration
		p.OwnerMeshName, p.OwnerNodeRID, p.OwnerNodeGeneration = demoNodeB.MeshName, demoNodeB.RID, 1
		payload, err := coordinator.EncodeUserSpotPayload(p)
		if err != nil {
			return err
		}
		if req.Capacity, err = authority.AddCapacity(req.Capacity, r.Snapshot.Allocation.Capacity); err != nil {
			return err
		}
		req.Participants = append(req.Participants, authority.AggregateParticipant{
			AuthorityKey: key, ExpectedStoreVersion: r.Snapshot.StoreVersion,
			OwnerTransition: authority.TransitionNewOwner, AuthorityPayload: payload,
		})
		digest.Write([]byte(key))
	}
	req.InventoryDigest = digest.Sum(nil)
	prep, err := s.PrepareAggregate(ctx, req)
	if err != nil {
		return err
	}
	if prep.Kind != authority.KindPrepared {
		return fmt.Errorf("prepare aggregate: %s", prep.Kind)
	}
	com, err := s.CommitAggregate(ctx, prep.Fence)
	if err != nil {
		return err
	}
	if com.Kind != authority.KindCommitted {
		return errors.New("commit aggregate: " + string(com.Kind))
	}
	return nil
}
