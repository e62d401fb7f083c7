package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/coordinator"
	"github.com/zlink-systems/authority/internal/embedded"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/preflight"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

// The shared server of the package's tests, and the namespace the demo
// workload populated on it before any test ran (so its revisions, and the
// golden files, are deterministic).
var (
	testEndpoint string
	testClient   *clientv3.Client
)

const goldenNS = "/golden/"

func TestMain(m *testing.M) { goleak.VerifyTestMain(mainRunner{m}) }

type mainRunner struct{ m *testing.M }

func (r mainRunner) Run() int {
	code, err := r.run()
	if err != nil {
		fmt.Fprintln(os.Stderr, "authorityctl tests:", err)
		return 1
	}
	return code
}

func (r mainRunner) run() (int, error) {
	dir, err := os.MkdirTemp("", "authorityctl-test-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// production limits, as the README asks and doctor checks by default
	srv, err := embedded.Start(ctx, embedded.Config{Dir: dir, MaxTxnOps: preflight.RecommendedMaxTxnOps, MaxRequestBytes: preflight.RecommendedMaxRequestBytes})
	if err != nil {
		return 0, err
	}
	defer srv.Close()
	testEndpoint = srv.Endpoint()
	testClient, err = clientv3.New(clientv3.Config{Endpoints: []string{testEndpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return 0, err
	}
	defer testClient.Close()
	store, err := etcdstore.New(ctx, etcdstore.Config{Client: testClient, Namespace: goldenNS})
	if err != nil {
		return 0, err
	}
	defer store.Close()
	leases, _, err := populateDemo(ctx, store, func(string, ...any) {})
	defer func() {
		for _, l := range leases {
			_ = l.Close(context.Background())
		}
	}()
	if err != nil {
		return 0, err
	}
	if err := abortGoldenReservation(ctx, store, leases[0].Token()); err != nil {
		return 0, err
	}
	return r.m.Run(), nil
}

// abortGoldenReservation reserves an Actor and aborts it, so that the
// golden namespace holds reservation terminals to list (a commit writes
// none from store version FewerKeys on; an abort still does).
func abortGoldenReservation(ctx context.Context, s *etcdstore.Store, owner authority.OwnerToken) error {
	request := []byte("never created")
	sum := sha256.Sum256(request)
	target := authority.CreationTarget{MeshName: demoMesh, NodeRID: demoNodeA.RID, NodeLifecycleGeneration: 1, Owner: owner}
	key := authority.ObjectKey{Kind: authority.ObjectActor, GlobalID: "aborted-1"}
	res, err := s.Reserve(ctx, authority.ReserveRequest{Key: key,
		Intent: authority.CreationIntent{StableType: demoActorType, RequestContentReference: coordinator.EncodeContentReference(request),
			RequestSHA256: sum[:], RequestEncodedSize: int64(len(request))},
		Target: target, CreatingPayload: []byte("creating"), Capacity: authority.CapacityVector{Actors: 1}})
	if err != nil || res.Kind != authority.KindReserved {
		return fmt.Errorf("reserve aborted-1: %v %v", res.Kind, err)
	}
	ab, err := s.Abort(ctx, authority.AbortRequest{Key: key, ReservationID: res.ReservationID, ExpectedStoreVersion: res.Creating.StoreVersion, Target: target})
	if err != nil || ab.Kind != authority.KindAborted {
		return fmt.Errorf("abort aborted-1: %v %v", ab.Kind, err)
	}
	return nil
}
