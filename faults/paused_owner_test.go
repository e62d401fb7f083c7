package faults_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/embedded"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// envPausedOwner makes the test binary run pausedOwnerMain (endpoint and
// namespace, space-separated) instead of its tests.
const envPausedOwner = "AUTHORITY_FAULTS_PAUSED_OWNER"

// pausedOwnerTTL is the child's owner lease TTL (etcd's minimum is ~2 s).
const pausedOwnerTTL = 2 * time.Second

// runPausedOwnerIfRequested runs the child owner when the environment asks
// for it, and exits; TestMain calls it first.
func runPausedOwnerIfRequested() {
	if v := os.Getenv(envPausedOwner); v != "" {
		os.Exit(pausedOwnerMain(v))
	}
}

// pausedOwnerMain holds an owner lease and creates Spots on its own node,
// one after another, printing one line per write: "write <n> <after-wake>
// <applied>". A gap of more than a TTL between two writes means the process
// was paused: every write from then on is after-wake.
func pausedOwnerMain(arg string) int {
	endpoint, ns, _ := strings.Cut(arg, " ")
	ctx := context.Background()
	s, err := etcdstore.New(ctx, etcdstore.Config{Endpoints: []string{endpoint}, Namespace: ns, RequestTimeout: 3 * time.Second})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer s.Close()
	lease, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "paused", pausedOwnerTTL)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("ready", lease.Token().LeaseGeneration)
	target := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, lease.Token())
	woke, last := false, time.Now()
	for n := 0; n < 100000; n++ {
		if time.Since(last) > pausedOwnerTTL {
			woke = true
		}
		last = time.Now()
		applied := pausedOwnerWrite(ctx, s, target, n)
		fmt.Printf("write %d %t %t\n", n, woke, applied)
		time.Sleep(20 * time.Millisecond)
	}
	return 0
}

// pausedOwnerWrite reserves and commits Spot n on target; it reports whether
// a write was applied (the reservation, and with it the commit's chance).
func pausedOwnerWrite(ctx context.Context, s *etcdstore.Store, target authority.CreationTarget, n int) bool {
	key := authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: fmt.Sprintf("spot-%d", n)}
	ref := fmt.Sprintf("content-%d", n)
	sum := sha256.Sum256([]byte(ref))
	res, err := s.Reserve(ctx, authority.ReserveRequest{
		Key: key, Target: target, CreatingPayload: []byte("creating"),
		Intent: authority.CreationIntent{StableType: conformance.DefaultStableType, RequestContentReference: ref,
			RequestSHA256: sum[:], RequestEncodedSize: int64(len(ref))},
		Capacity: conformance.Capacity(authority.ObjectUserSpot, conformance.DefaultStableType),
	})
	if err != nil || res.Kind != authority.KindReserved {
		return false
	}
	_, _ = s.Commit(ctx, authority.CommitRequest{Key: key, ReservationID: res.ReservationID,
		ExpectedStoreVersion: res.Creating.StoreVersion, Target: target, ReadyPayload: []byte("ready")})
	return true
}

// An owner process stopped (SIGSTOP) for longer than its lease TTL wakes up
// (SIGCONT) still writing: every write it tries after waking is refused by
// the lease fence, while another owner took its node's objects over.
func TestPausedOwnerIsFenced(t *testing.T) {
	trials := 2
	if os.Getenv("AUTHORITY_SOAK") != "" {
		trials = 10
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := embedded.Start(ctx, embedded.Config{ClientAddr: freeAddr(t), AutoCompactionRetention: "0"})
	require.NoError(t, err)
	defer srv.Close()
	beforePause, afterWake, applied := 0, 0, 0
	for trial := range trials {
		p, a, b := pausedOwnerTrial(t, ctx, srv.Endpoint(), fmt.Sprintf("/paused-%d/", trial))
		beforePause += p
		afterWake += a
		applied += b
	}
	t.Logf("paused-owner: trials=%d applied-before-pause=%d writes-after-wake=%d applied=%d", trials, beforePause, afterWake, applied)
	require.Positive(t, beforePause, "the owner's writes never applied, even while its lease was held (the test cannot fail)")
	require.Positive(t, afterWake, "the owner never wrote after waking (the test cannot fail)")
	require.Zero(t, applied, "a write after waking was applied")
}

func pausedOwnerTrial(t *testing.T, ctx context.Context, endpoint, ns string) (beforePause, afterWake, applied int) {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envPausedOwner+"="+endpoint+" "+ns)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := bufio.NewScanner(out)
	require.True(t, lines.Scan(), "child said nothing")
	var gen int64
	_, err = fmt.Sscanf(lines.Text(), "ready %d", &gen)
	require.NoError(t, err, "child: %s", lines.Text())
	// let it write a while, then pause it past its TTL
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	time.Sleep(3 * pausedOwnerTTL)
	// its lease is gone: another owner takes the node's objects over
	other, fx := embeddedStore(t, endpoint, ns)
	_, err = other.RemoveAllByOwner(ctx, authority.OwnerToken{OwnerID: "paused", LeaseGeneration: gen})
	require.NoError(t, err)
	taker := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "taker", LeaseGeneration: 1})
	fx.SetLive(taker, true)
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	for lines.Scan() {
		var n int
		var woke, ok bool
		if _, err := fmt.Sscanf(lines.Text(), "write %d %t %t", &n, &woke, &ok); err != nil {
			t.Fatalf("child: %s", lines.Text())
		}
		if !woke && ok {
			beforePause++
		}
		if woke {
			afterWake++
			if ok {
				applied++
			}
			if afterWake >= 20 {
				break
			}
		}
	}
	return beforePause, afterWake, applied
}
