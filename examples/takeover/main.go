// Command takeover is a small multi-node "runtime" on the authority store:
// three nodes on one embedded etcd server each hold an owner lease and place
// User Spots; node-b runs in a process of its own, which is then killed (it
// never revokes its lease, and etcd expires it after its TTL), and node-a,
// seeing node-b's owner no longer live, takes every object of node-b over
// with one aggregate move.
//
//	go run ./examples/takeover
//
// It prints each step, how long after the kill etcd expired node-b's lease,
// and "took over N objects of node-b: ..." when the move committed. CI runs
// it (.ci/run) and so does its test.
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"github.com/zlink-systems/authority/examples/throwawayetcd"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// namespace is where the runtime's authority rows live.
const namespace = "/takeover/v1/"

// leaseTTL is the owner leases' TTL: how long a crashed node's objects stay
// fenced before another node may take them over.
const leaseTTL = 2 * time.Second

// nodeProcessEnv, set to an etcd endpoint, makes the program node-b's
// process (see nodeProcess) instead of the runtime.
const nodeProcessEnv = "TAKEOVER_NODE_B_ENDPOINT"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if endpoint := os.Getenv(nodeProcessEnv); endpoint != "" {
		err = nodeProcess(ctx, endpoint, os.Stdin, os.Stdout)
	} else {
		err = run(ctx, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "takeover:", err)
		stop()
		os.Exit(1)
	}
}

// node is one member of the runtime: its own store (its own etcd client, as
// a separate process would have) and owner lease.
type node struct {
	desc  authority.NodeDescriptor
	store *etcdstore.Store
	lease *etcdstore.OwnerLease
}

// run starts embedded etcd, nodes a and c in this process and node-b in a
// process of its own, places objects, kills node-b's process and lets
// node-a take its objects over, reporting to out.
func run(ctx context.Context, out io.Writer) error {
	fmt.Fprintf(out, "Three nodes place carts on one etcd; node-b's process is killed, and node-a takes its\n"+
		"carts over once etcd expires node-b's owner lease (TTL %s).\n", leaseTTL)
	endpoint, stopEtcd, err := throwawayetcd.Start(ctx)
	if err != nil {
		return err
	}
	defer stopEtcd()
	fmt.Fprintf(out, "embedded etcd on %s\n", endpoint)

	nodes := map[string]*node{}
	defer func() {
		for _, n := range nodes {
			n.stop()
		}
	}()
	var nodeB *exec.Cmd
	defer func() { killNode(nodeB) }()
	var deadOwner authority.OwnerToken
	for _, name := range []string{"node-a", "node-b", "node-c"} {
		if name == "node-b" {
			if nodeB, deadOwner, err = startNodeProcess(ctx, endpoint); err != nil {
				return err
			}
			fmt.Fprintf(out, "%s: owner lease %s generation %d, placed 2 carts (process %d)\n",
				name, deadOwner.OwnerID, deadOwner.LeaseGeneration, nodeB.Process.Pid)
			continue
		}
		n, err := startNode(ctx, endpoint, name)
		if err != nil {
			return err
		}
		nodes[name] = n
		if err := n.placeCarts(ctx); err != nil {
			return err
		}
		fmt.Fprintf(out, "%s: owner lease %s generation %d, placed 2 carts\n",
			name, n.lease.Token().OwnerID, n.lease.Token().LeaseGeneration)
	}
	survivor := nodes["node-a"]
	if err := printPlacement(ctx, out, survivor.store); err != nil {
		return err
	}

	killed := time.Now()
	killNode(nodeB)
	nodeB = nil
	fmt.Fprintln(out, "node-b's process killed: its lease is no longer renewed, nor revoked")
	if err := survivor.awaitDead(ctx, authority.NodeDescriptor{MeshName: "demo", RID: "node-b"}, deadOwner); err != nil {
		return err
	}
	fmt.Fprintf(out, "node-a: node-b's owner lease expired at etcd %.1fs after the kill (its TTL: %s)\n",
		time.Since(killed).Seconds(), leaseTTL)
	keys, err := survivor.takeOver(ctx, deadOwner)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "took over %d objects of node-b: %v\n", len(keys), keys)
	return printPlacement(ctx, out, survivor.store)
}

// startNodeProcess starts node-b as a process of its own (this program,
// with nodeProcessEnv set) and waits until it placed its carts; it returns
// the process and node-b's owner token.
func startNodeProcess(ctx context.Context, endpoint string) (*exec.Cmd, authority.OwnerToken, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, authority.OwnerToken{}, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), nodeProcessEnv+"="+endpoint)
	cmd.Stderr = os.Stderr
	// node-b exits when its stdin closes: cmd holds the pipe's end until
	// Wait, and the system closes it when this process ends
	if _, err := cmd.StdinPipe(); err != nil {
		return nil, authority.OwnerToken{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, authority.OwnerToken{}, err
	}
	if err := cmd.Start(); err != nil {
		return nil, authority.OwnerToken{}, err
	}
	var owner authority.OwnerToken
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err == nil {
		_, err = fmt.Sscanf(line, "ready %s %d\n", &owner.OwnerID, &owner.LeaseGeneration)
	}
	if err != nil {
		killNode(cmd)
		return nil, authority.OwnerToken{}, fmt.Errorf("node-b's process did not start (%q): %w", line, err)
	}
	return cmd, owner, nil
}

// killNode kills node-b's process (SIGKILL: it runs no cleanup, as after a
// crash) and waits for it to end.
func killNode(cmd *exec.Cmd) {
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// nodeProcess is node-b's process: it starts node-b on endpoint, places its
// carts, says "ready OWNER GENERATION" on out and runs until it is killed (or
// stdin, held by the runtime, closes).
func nodeProcess(ctx context.Context, endpoint string, stdin io.Reader, out io.Writer) error {
	n, err := startNode(ctx, endpoint, "node-b")
	if err != nil {
		return err
	}
	defer n.stop()
	if err := n.placeCarts(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "ready %s %d\n", n.lease.Token().OwnerID, n.lease.Token().LeaseGeneration)
	if _, err := io.Copy(io.Discard, stdin); err != nil && !errors.Is(err, os.ErrClosed) {
		return err
	}
	return nil
}

// startNode opens a node's store on endpoint (its own etcd client, as a
// separate process has) and acquires its owner lease.
func startNode(ctx context.Context, endpoint, name string) (*node, error) {
	store, err := etcdstore.New(ctx, etcdstore.Config{
		Endpoints: []string{endpoint}, Namespace: namespace, RequestTimeout: 5 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	n := &node{desc: authority.NodeDescriptor{MeshName: "demo", RID: name}, store: store}
	if n.lease, err = store.Registry().Acquire(ctx, n.desc, 1, "owner-"+name, leaseTTL); err != nil {
		_ = store.Close()
		return nil, err
	}
	return n, nil
}

// placeCarts places the node's two carts, cart-X-1 and cart-X-2 on node-X.
func (n *node) placeCarts(ctx context.Context) error {
	for i := 1; i <= 2; i++ {
		if err := n.place(ctx, fmt.Sprintf("cart-%s-%d", n.desc.RID[len(n.desc.RID)-1:], i)); err != nil {
			return err
		}
	}
	return nil
}

// place creates a User Spot on the node: reserve, then commit.
func (n *node) place(ctx context.Context, id string) error {
	request := []byte("create " + id)
	sum := sha256.Sum256(request)
	req := authority.ReserveRequest{
		Key: authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: id},
		Intent: authority.CreationIntent{
			StableType: "cart", RequestContentReference: "inline:" + id,
			RequestSHA256: sum[:], RequestEncodedSize: int64(len(request)),
		},
		Target: authority.CreationTarget{
			MeshName: n.desc.MeshName, NodeRID: n.desc.RID, NodeLifecycleGeneration: 1, Owner: n.lease.Token(),
		},
		CreatingPayload: []byte("creating"),
		Capacity: authority.CapacityVector{Spots: 1, SpotType: &authority.SpotTypeCapacity{
			ObjectKind: authority.ObjectUserSpot, StableType: "cart", Count: 1,
		}},
	}
	reserved, err := n.store.Reserve(ctx, req)
	if err != nil {
		return err
	}
	if reserved.Kind != authority.KindReserved {
		return fmt.Errorf("reserving %s: %s", id, reserved.Kind)
	}
	committed, err := n.store.Commit(ctx, authority.CommitRequest{
		Key: req.Key, ReservationID: reserved.ReservationID, ExpectedStoreVersion: reserved.Creating.StoreVersion,
		Target: req.Target, ReadyPayload: []byte("cart " + id + " on " + n.desc.RID),
	})
	if err != nil {
		return err
	}
	if committed.Kind != authority.KindCommitted {
		return fmt.Errorf("committing %s: %s", id, committed.Kind)
	}
	return nil
}

// awaitDead waits until owner is no longer live on node: its lease expired
// at etcd and took its liveness key with it.
func (n *node) awaitDead(ctx context.Context, node authority.NodeDescriptor, owner authority.OwnerToken) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		live, err := n.store.IsTargetLive(ctx, node, 1, owner)
		if err != nil {
			return err
		}
		if !live {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// takeOver moves every active row of owner onto this node's lease with one
// aggregate: prepare (checks each row at the version read and reserves the
// capacity here), then commit. It returns the keys it moved.
func (n *node) takeOver(ctx context.Context, owner authority.OwnerToken) ([]authority.Key, error) {
	req := authority.AggregatePrepareRequest{
		AggregateID: "takeover/" + owner.OwnerID, AggregateGeneration: owner.LeaseGeneration,
		TargetOwner: n.lease.Token(), TargetDescriptor: n.desc, TargetDescriptorLifecycleGeneration: 1,
	}
	var keys []authority.Key
	var cursor authority.ScanCursor
	for {
		page, err := n.store.ListAuthorities(ctx, "", cursor, authority.MaxScanLimit)
		if err != nil {
			return nil, err
		}
		if page.Kind != authority.KindPage {
			return nil, fmt.Errorf("listing rows: %s", page.Kind)
		}
		for _, item := range page.Items {
			s := item.Snapshot
			if s.Owner() != owner || s.Allocation.State != authority.AllocationActive {
				continue
			}
			if req.Capacity, err = authority.AddCapacity(req.Capacity, s.Allocation.Capacity); err != nil {
				return nil, err
			}
			req.Participants = append(req.Participants, authority.AggregateParticipant{
				AuthorityKey: item.Key, ExpectedStoreVersion: s.StoreVersion,
				OwnerTransition:  authority.TransitionNewOwner,
				AuthorityPayload: append(s.Payload, " (taken over by "+n.desc.RID+")"...),
			})
			keys = append(keys, item.Key)
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	digest := sha256.Sum256(fmt.Append(nil, keys))
	req.InventoryDigest = digest[:]
	prepared, err := n.store.PrepareAggregate(ctx, req)
	if err != nil {
		return nil, err
	}
	if prepared.Kind != authority.KindPrepared && prepared.Kind != authority.KindAlreadyPrepared {
		return nil, fmt.Errorf("preparing the take-over: %s", prepared.Kind)
	}
	committed, err := n.store.CommitAggregate(ctx, prepared.Fence)
	if err != nil {
		return nil, err
	}
	if committed.Kind != authority.KindCommitted && committed.Kind != authority.KindAlreadyCommitted {
		return nil, fmt.Errorf("committing the take-over: %s", committed.Kind)
	}
	return keys, nil
}

// stop shuts a live node down: its lease is revoked, its rows stay.
func (n *node) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = n.lease.Close(ctx)
	_ = n.store.Close()
}

// printPlacement lists every row: key, owner and node.
func printPlacement(ctx context.Context, out io.Writer, store *etcdstore.Store) error {
	page, err := store.ListAuthorities(ctx, "", "", authority.MaxScanLimit)
	if err != nil {
		return err
	}
	for _, item := range page.Items {
		s := item.Snapshot
		fmt.Fprintf(out, "  %-22s owner %s@%d on %s\n", item.Key, s.OwnerID, s.OwnerLeaseGeneration, s.Allocation.Descriptor.RID)
	}
	return nil
}
