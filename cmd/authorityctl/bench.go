package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The workloads of authorityctl bench.
const (
	workloadReserveCommit = "reserve-commit"
	workloadCAS           = "cas"
	workloadAggregate     = "aggregate"
	workloadList          = "list"
	workloadMixed         = "mixed"
)

var benchWorkloads = []string{workloadReserveCommit, workloadCAS, workloadAggregate, workloadList, workloadMixed}

// The accepted ranges of bench's flags.
const (
	maxBenchClients  = 1024
	minBenchDuration = 100 * time.Millisecond
	maxBenchDuration = 24 * time.Hour
	maxBenchRows     = 10_000_000
	maxBenchPayload  = 512 * 1024
	// benchCleanupBudget bounds the cleanup after the run (also after
	// Ctrl-C, on a context the signal does not end).
	benchCleanupBudget = 2 * time.Minute
)

// errNamespaceHoldsRows refuses a bench against a namespace that holds keys
// without --yes.
var errNamespaceHoldsRows = errors.New("the namespace holds keys; bench adds load next to them: pass --yes to run anyway")

// benchOptions are bench's flags.
type benchOptions struct {
	workload     string
	clients      int
	duration     time.Duration
	rows         int
	payloadBytes int
	yes          bool
}

const benchLong = `Measure this store's operations on your own cluster, like 'etcdctl check
perf' but for reserve+commit, CAS, aggregates and listings.

The run happens in a fresh namespace <namespace>bench-<random>/ under the
configured --namespace: first --rows rows are created (the rows that cas,
aggregate, list and mixed work on), then --clients clients run the workload
for --duration, then a raw-etcd baseline of the same shape runs with the
same clients for the same time, and the ratio store/baseline is printed:
  reserve-commit  two Txns: create a new key, then put it if unchanged
  cas             one Txn: put a row-sized value if the key is unchanged
  list            one range read of 1000 of the same rows
aggregate and mixed get no baseline (no raw op has their shape). Every key
and lease the run created is deleted at the end, also after Ctrl-C, which
prints what was measured until then (-o json too) and says it cleaned up.

Workloads (one op is):
  reserve-commit  a reservation and its commit of a new User Spot (2 Txns)
  cas             a CompareExchangeAuthority put on the client's own row
  aggregate       prepare + commit of an aggregate moving 4 of the client's
                  rows to the other of two owners, then a read of each
  list            one 1000-row page of the --rows rows (wrapping around)
  mixed           per 10 ops: 2 reserve-commit, 6 cas, 1 page of 100, 1 read

bench writes: it refuses a namespace that already holds keys unless --yes.
Live progress goes to stderr (a bar on a terminal, a line a second
otherwise); the result goes to stdout (-o json|yaml for automation).`

func newBenchCommand(g *globals) *cobra.Command {
	var o benchOptions
	cmd := &cobra.Command{
		Use:         "bench --workload W [--clients N] [--duration D] [--rows N] [--payload-bytes B]",
		Annotations: map[string]string{annotationWrites: "rows and leases in a fresh namespace <namespace>bench-<random>/, removed after"},
		Short:       "Measure the store's operations on this cluster against a raw-etcd baseline",
		Long:        benchLong,
		Args:        exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check(); err != nil {
				return err
			}
			return runBench(cmd.Context(), g, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.workload, "workload", "", "workload: "+strings.Join(benchWorkloads, "|"))
	f.IntVar(&o.clients, "clients", 16, fmt.Sprintf("concurrent clients (1..%d)", maxBenchClients))
	f.DurationVar(&o.duration, "duration", 10*time.Second, "how long the workload and the baseline each run")
	f.IntVar(&o.rows, "rows", 1000, fmt.Sprintf("rows created before the run (1..%d)", maxBenchRows))
	f.IntVar(&o.payloadBytes, "payload-bytes", 64, fmt.Sprintf("payload of every row (0..%d)", maxBenchPayload))
	f.BoolVar(&o.yes, "yes", false, "run even if the namespace already holds keys")
	return cmd
}

// check validates the flags before anything connects.
func (o benchOptions) check() error {
	if !slices.Contains(benchWorkloads, o.workload) {
		return usageError(fmt.Errorf("--workload %q: want one of %s", o.workload, strings.Join(benchWorkloads, ", ")))
	}
	if err := intRange("--clients", int64(o.clients), 1, maxBenchClients); err != nil {
		return err
	}
	if err := durationRange("--duration", o.duration, minBenchDuration, maxBenchDuration); err != nil {
		return err
	}
	if err := intRange("--rows", int64(o.rows), 1, maxBenchRows); err != nil {
		return err
	}
	return intRange("--payload-bytes", int64(o.payloadBytes), 0, maxBenchPayload)
}

// runBench connects, refuses a namespace holding keys without --yes, and
// runs the workload and the baseline in a fresh namespace it removes after.
func runBench(ctx context.Context, g *globals, o benchOptions) (err error) {
	c, _, err := g.dial(ctx, false)
	if err != nil {
		return err
	}
	defer c.Close()
	held, err := c.Get(ctx, g.namespace, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("count the keys of %s: %w", g.namespace, err)
	}
	if held.Count > 0 && !o.yes {
		return fmt.Errorf("%w (%s holds %d keys)", errNamespaceHoldsRows, g.namespace, held.Count)
	}
	ns, err := benchNamespace(g.namespace)
	if err != nil {
		return err
	}
	leases := &leaseTracker{Lease: c.Lease}
	c.Lease = leases
	b := &benchRun{g: g, o: o, c: c, ns: ns}
	defer func() {
		stopped := ctx.Err() != nil
		if stopped {
			fmt.Fprintf(g.stderr, "bench: stopped; cleaning up %s…\n", ns)
		}
		cleaned, cerr := b.cleanup(context.WithoutCancel(ctx), leases)
		if cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup of %s: %w (delete that prefix by hand)", ns, cerr))
			return
		}
		b.view.Cleanup = cleaned
		if stopped {
			fmt.Fprintf(g.stderr, "bench: cleaned up: %d keys deleted, %d leases revoked\n", cleaned.KeysDeleted, cleaned.LeasesRevoked)
			b.view.Interrupted = true
		}
		if err == nil || stopped {
			if rerr := b.render(); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()
	return b.run(ctx)
}

// benchNamespace is a fresh namespace under ns: bench-<16 hex digits>/.
func benchNamespace(ns string) (string, error) {
	var r [8]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", err
	}
	return ns + "bench-" + hex.EncodeToString(r[:]) + "/", nil
}

// benchRun is one bench invocation.
type benchRun struct {
	g     *globals
	o     benchOptions
	c     *clientv3.Client
	ns    string
	store *etcdstore.Store
	view  benchView
}

// cleanup closes the store (revoking its owner leases), revokes every lease
// the run granted and deletes the run's namespace.
func (b *benchRun) cleanup(ctx context.Context, leases *leaseTracker) (cleanupView, error) {
	ctx, cancel := context.WithTimeout(ctx, benchCleanupBudget)
	defer cancel()
	var out cleanupView
	var errs []error
	if b.store != nil {
		errs = append(errs, b.store.Close())
	}
	for _, id := range leases.granted() {
		if _, err := leases.Lease.Revoke(ctx, id); err != nil && !strings.Contains(err.Error(), "lease not found") {
			errs = append(errs, fmt.Errorf("revoke lease %x: %w", int64(id), err))
			continue
		}
		out.LeasesRevoked++
	}
	resp, err := b.c.Delete(ctx, b.ns, clientv3.WithPrefix())
	if err != nil {
		errs = append(errs, err)
	} else {
		out.KeysDeleted = resp.Deleted
	}
	return out, errors.Join(errs...)
}

// leaseTracker is the client's Lease that remembers every lease it granted,
// so the cleanup revokes exactly the leases of the run.
type leaseTracker struct {
	clientv3.Lease
	mu  sync.Mutex
	ids []clientv3.LeaseID
}

// Grant grants a lease and remembers it.
func (l *leaseTracker) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	resp, err := l.Lease.Grant(ctx, ttl)
	if err == nil {
		l.mu.Lock()
		l.ids = append(l.ids, resp.ID)
		l.mu.Unlock()
	}
	return resp, err
}

func (l *leaseTracker) granted() []clientv3.LeaseID {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ids)
}
