package revguard

import (
	"errors"
	"testing"

	authority "github.com/zlink-systems/authority"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// A response is compared with the highest revision seen when its request
// was sent: one answered before a concurrent write may arrive after it.
func TestRegressionGuardComparesWithTheFloorAtSend(t *testing.T) {
	g := New("ns/", nil)
	hdr := func(rev int64, cluster uint64) *pb.ResponseHeader {
		return &pb.ResponseHeader{Revision: rev, ClusterId: cluster}
	}
	if err := g.observe(g.Floor(), hdr(10, 7), true); err != nil {
		t.Fatal(err)
	}
	floor := g.Floor()                                             // a read is sent at 10 ...
	if err := g.observe(g.Floor(), hdr(12, 7), true); err != nil { // ... a write answers 12 ...
		t.Fatal(err)
	}
	if err := g.observe(floor, hdr(11, 7), false); err != nil { // ... then the read, at 11
		t.Fatalf("a concurrent read was taken for a regression: %v", err)
	}
	if g.Floor() != 12 {
		t.Fatalf("floor %d, want 12", g.Floor())
	}
	if g.refused() != nil {
		t.Fatal("refused before any regression")
	}
	err := g.observe(g.Floor(), hdr(11, 7), true)
	if !errors.Is(err, ErrClusterRegressed) || !errors.Is(err, authority.ErrOutcomeUnknown) {
		t.Fatalf("write answered below the floor: %v", err)
	}
	select {
	case <-g.Regressed():
	default:
		t.Fatal("regressed not closed")
	}
	if err := g.refused(); !errors.Is(err, ErrClusterRegressed) || !errors.Is(err, authority.ErrUnavailable) {
		t.Fatalf("refused: %v", err)
	}
}

func TestRegressionGuardRefusesAnotherCluster(t *testing.T) {
	g := New("ns/", nil)
	if err := g.observe(0, &pb.ResponseHeader{Revision: 5, ClusterId: 1}, false); err != nil {
		t.Fatal(err)
	}
	if err := g.ObserveCluster(&pb.ResponseHeader{ClusterId: 0}); err != nil {
		t.Fatalf("a header without a cluster ID: %v", err)
	}
	err := g.observe(g.Floor(), &pb.ResponseHeader{Revision: 900, ClusterId: 2}, false)
	if !errors.Is(err, ErrClusterRegressed) || !errors.Is(err, authority.ErrUnavailable) || errors.Is(err, authority.ErrOutcomeUnknown) {
		t.Fatalf("read from another cluster: %v", err)
	}
	if g.refused() == nil {
		t.Fatal("not refused after another cluster answered")
	}
}

// TestGuardProbesAfterEndpointsChange: moving the client to other endpoints
// (SetEndpoints) counts as a connection change, so the next write is probed
// even when the connection's state never left Ready.
func TestGuardProbesAfterEndpointsChange(t *testing.T) {
	g := New("ns/", nil)
	eps := []string{"127.0.0.1:1"}
	g.Follow(func() []string { return eps })
	g.endpointsMoved()
	if g.changes.Load() != 0 {
		t.Fatalf("unchanged endpoints counted as a change")
	}
	eps = []string{"127.0.0.1:2"}
	g.endpointsMoved()
	if g.changes.Load() != 1 || g.verified.Load() >= g.changes.Load() {
		t.Fatalf("changed endpoints: changes=%d verified=%d, want a probe due", g.changes.Load(), g.verified.Load())
	}
	g.endpointsMoved()
	if g.changes.Load() != 1 {
		t.Fatalf("the same new endpoints counted twice")
	}
}
