package faults_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// The failover test's nodes run in child processes (as the paused owner
// does): a holder fills its rows and then waits to be killed; a writer
// keeps placing rows on its own node and reports its counts.

// envFailoverNode names the environment variable that makes the test binary
// run a failover node instead of its tests.
const envFailoverNode = "FAULTS_FAILOVER_NODE"

// failoverWriteTimeout bounds one write of a writer node: a write that does
// not succeed within it counts as failed.
const failoverWriteTimeout = 10 * time.Second

// failoverNodeConfig is what the test tells a node process.
type failoverNodeConfig struct {
	Endpoints []string      `json:"endpoints"`
	Namespace string        `json:"namespace"`
	Role      string        `json:"role"` // "holder" or "writer"
	RID       string        `json:"rid"`
	Rows      int           `json:"rows"` // holder: how many rows it fills
	TTL       time.Duration `json:"ttl"`
}

// failoverNodeLine is one line a node writes: "ready" (once it holds its
// lease), the holder's "fill" progress and "filled" (its rows placed), or a
// writer's cumulative "writes" counts.
type failoverNodeLine struct {
	Event      string `json:"event"`
	OwnerID    string `json:"ownerID,omitempty"`
	Generation int64  `json:"generation,omitempty"`
	At         int64  `json:"at,omitempty"` // wall clock, Unix ns (one machine)
	OK         int64  `json:"ok,omitempty"`
	Failed     int64  `json:"failed,omitempty"`
	Err        string `json:"err,omitempty"` // the last failure
}

// runFailoverNodeIfRequested runs a failover node and exits when the
// process was started as one; otherwise it returns at once.
func runFailoverNodeIfRequested() {
	runChildIfRequested(envFailoverNode, "failover node", runFailoverNode)
}

// failoverPayload is the payload of the holder's row i: 80 % 64 B, 15 %
// 1 KiB, 5 % 16 KiB (mean 1 KiB, as TestScale's).
func failoverPayload(i int) []byte {
	n := 64
	switch i % 20 {
	case 16, 17, 18:
		n = 1 << 10
	case 19:
		n = 16 << 10
	}
	return bytes.Repeat([]byte{'a' + byte(i%26)}, n)
}

func runFailoverNode(cfg failoverNodeConfig) error {
	ownerID := "failover-" + cfg.RID
	node := authority.NodeDescriptor{MeshName: conformance.NodeA.MeshName, RID: cfg.RID}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	st, err := etcdstore.New(ctx, etcdstore.Config{Client: cli, Namespace: cfg.Namespace, RequestTimeout: failoverWriteTimeout,
		SkipVersionCheck: true, MaxTxnOps: failoverMaxTxnOps})
	if err != nil {
		return err
	}
	var lease *etcdstore.OwnerLease
	if err := childRetry(func(ctx context.Context) error {
		lease, err = st.Registry().Acquire(ctx, node, conformance.NodeLifecycle, ownerID, cfg.TTL)
		return err
	}); err != nil {
		return fmt.Errorf("acquire: %w", err)
	}
	tgt := conformance.Target(node, conformance.NodeLifecycle, lease.Token())
	out := json.NewEncoder(os.Stdout)
	ready := failoverNodeLine{Event: "ready", OwnerID: ownerID, Generation: lease.Token().LeaseGeneration}
	if cfg.Role == "holder" {
		// ready once it holds its lease; then its fill's progress, then
		// "filled"; then it waits to be killed
		if err := out.Encode(ready); err != nil {
			return err
		}
		var placed atomic.Int64
		go func() {
			for {
				time.Sleep(500 * time.Millisecond)
				_ = out.Encode(failoverNodeLine{Event: "fill", At: time.Now().UnixNano(), OK: placed.Load()})
			}
		}()
		if err := fillHolder(st, tgt, cfg.RID, cfg.Rows, &placed); err != nil {
			return err
		}
		if err := out.Encode(failoverNodeLine{Event: "filled", OK: placed.Load()}); err != nil {
			return err
		}
		select {} // until killed
	}
	if err := out.Encode(ready); err != nil {
		return err
	}
	return writeUntilEnded(st, tgt, cfg.RID, out)
}

// fillHolder places rows active User Spots on tgt, 32 at a time, counting
// them in placed.
func fillHolder(st *etcdstore.Store, tgt authority.CreationTarget, rid string, rows int, placed *atomic.Int64) error {
	var wg sync.WaitGroup
	var next atomic.Int64
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < rows; i = int(next.Add(1)) - 1 {
				if _, err := placeWithPayload(st, tgt, fmt.Sprintf("%s-%07d", rid, i), failoverPayload(i)); err != nil {
					errs <- err
					return
				}
				placed.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// writeUntilEnded places new rows on tgt from 4 goroutines, each write a
// reserve and a commit with no retry, and reports the counts every 100 ms
// until the process is ended.
func writeUntilEnded(st *etcdstore.Store, tgt authority.CreationTarget, rid string, out *json.Encoder) error {
	var ok, failed, seq atomic.Int64
	var lastErr atomic.Value
	for range 4 {
		go func() {
			for {
				id := fmt.Sprintf("%s-w%07d", rid, seq.Add(1))
				if err := writeOnceTimed(st, tgt, id); err != nil {
					failed.Add(1)
					lastErr.Store(err.Error())
					continue
				}
				ok.Add(1)
			}
		}()
	}
	for {
		time.Sleep(100 * time.Millisecond)
		l := failoverNodeLine{Event: "writes", At: time.Now().UnixNano(), OK: ok.Load(), Failed: failed.Load()}
		if e, isStr := lastErr.Load().(string); isStr {
			l.Err = e
		}
		if err := out.Encode(l); err != nil {
			return err
		}
	}
}

// writeOnceTimed reserves and commits id on tgt, within failoverWriteTimeout.
func writeOnceTimed(st *etcdstore.Store, tgt authority.CreationTarget, id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), failoverWriteTimeout)
	defer cancel()
	req := reserveRequest(authority.ObjectUserSpot, id, tgt, "creating")
	res, err := st.Reserve(ctx, req)
	if err != nil {
		return err
	}
	if res.Kind != authority.KindReserved {
		return fmt.Errorf("reserve %s: %s", id, res.Kind)
	}
	c, err := st.Commit(ctx, reservation{req: req, id: res.ReservationID, row: res.Creating}.commit("ready"))
	if err != nil {
		return err
	}
	if c.Kind != authority.KindCommitted {
		return fmt.Errorf("commit %s: %s", id, c.Kind)
	}
	return nil
}
