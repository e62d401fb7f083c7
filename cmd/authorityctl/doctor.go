package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/etcdpage"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Doctor check outcomes.
const (
	checkOK   = "ok"
	checkWarn = "warn"
	checkFail = "fail"
	checkInfo = "info"
)

// checkView is one doctor finding.
type checkView struct {
	Check  string `json:"check"`
	Status string `json:"status"`
	Detail string `json:"detail"`
}

// memberView is one endpoint's status.
type memberView struct {
	Endpoint    string   `json:"endpoint"`
	Reachable   bool     `json:"reachable"`
	Error       string   `json:"error,omitempty"`
	MemberID    string   `json:"memberId,omitempty"`
	Version     string   `json:"version,omitempty"`
	Leader      string   `json:"leader,omitempty"`
	IsLearner   bool     `json:"isLearner,omitempty"`
	RaftIndex   uint64   `json:"raftIndex,omitempty"`
	DBSize      int64    `json:"dbSize,omitempty"`
	DBSizeInUse int64    `json:"dbSizeInUse,omitempty"`
	DBSizeQuota int64    `json:"dbSizeQuota,omitempty"`
	Errors      []string `json:"errors,omitempty"`
}

type doctorView struct {
	Endpoints []memberView `json:"endpoints"`
	Checks    []checkView  `json:"checks"`
}

func (d *doctorView) add(check, status, format string, args ...any) {
	d.Checks = append(d.Checks, checkView{Check: check, Status: status, Detail: fmt.Sprintf(format, args...)})
}

func newDoctorCommand(g *globals) *cobra.Command {
	var maxTxnOps, maxRequestBytes int
	var noProbe bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check the etcd cluster against what the authority store needs",
		Long: `Check cluster health and version per endpoint, the leader, DB size against
the quota, alarms, whether compaction runs, and whether the server accepts the
Txn size (--max-txn-ops) and request size (--max-request-bytes) the provider is
configured with, and whether every node's capacity epoch is at least as new
as its capacity entries (an entry newer than its node's epoch was written by a
build that does not put epochs). The limit probes write scratch keys under the namespace
("<namespace>doctor-probe/") and delete them; --no-probe skips them.
Exits 1 when a check fails.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.commandContext(cmd.Context())
			defer cancel()
			c, statuses, err := g.dial(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			d := &doctorView{Endpoints: []memberView{}, Checks: []checkView{}}
			doctorMembers(ctx, c, statuses, d)
			doctorCluster(ctx, c, g.namespace, d)
			doctorCapacityEpochs(ctx, c, g.namespace, d)
			if noProbe {
				d.add("limits", checkInfo, "probes skipped (--no-probe)")
			} else {
				doctorLimits(ctx, c, g.namespace, maxTxnOps, maxRequestBytes, d)
			}
			d.add("lease checkpointing", checkInfo, "not detectable through the client API; run members with "+
				"--feature-gates=LeaseCheckpoint=true,LeaseCheckpointPersist=true so leader changes do not extend owner leases")
			t := &table{header: []string{"CHECK", "STATUS", "DETAIL"}}
			failed := 0
			for _, ch := range d.Checks {
				t.add(ch.Check, ch.Status, ch.Detail)
				if ch.Status == checkFail {
					failed++
				}
			}
			if err := render(g.stdout, g.output, d, t); err != nil {
				return err
			}
			if failed > 0 {
				return fmt.Errorf("doctor: %d check(s) failed", failed)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&maxTxnOps, "max-txn-ops", etcdstore.DefaultMaxTxnOps, "the provider's MaxTxnOps to verify")
	cmd.Flags().IntVar(&maxRequestBytes, "max-request-bytes", etcdstore.DefaultMaxRequestBytes, "the provider's MaxRequestBytes to verify")
	cmd.Flags().BoolVar(&noProbe, "no-probe", false, "skip the write probes of the limits")
	return cmd
}

func doctorMembers(ctx context.Context, c *clientv3.Client, statuses []endpointStatus, d *doctorView) {
	names := map[uint64]string{}
	if ml, err := c.MemberList(ctx); err == nil {
		for _, m := range ml.Members {
			names[m.ID] = m.Name
		}
	}
	member := func(id uint64) string {
		if n := names[id]; n != "" {
			return fmt.Sprintf("%s (%x)", n, id)
		}
		return fmt.Sprintf("%x", id)
	}
	leaders := map[uint64]bool{}
	for _, s := range statuses {
		m := memberView{Endpoint: s.endpoint, Reachable: s.err == nil}
		if s.err != nil {
			m.Error = s.err.Error()
			d.Endpoints = append(d.Endpoints, m)
			d.add("endpoint "+s.endpoint, checkFail, "unreachable: %v", s.err)
			continue
		}
		st := s.status
		m.MemberID, m.Version, m.IsLearner, m.RaftIndex = fmt.Sprintf("%x", st.Header.MemberId), st.Version, st.IsLearner, st.RaftIndex
		m.DBSize, m.DBSizeInUse, m.DBSizeQuota, m.Errors = st.DbSize, st.DbSizeInUse, st.DbSizeQuota, st.Errors
		if st.Leader != 0 {
			m.Leader = member(st.Leader)
			leaders[st.Leader] = true
		}
		d.Endpoints = append(d.Endpoints, m)
		status, detail := checkOK, fmt.Sprintf("healthy, etcd %s, member %s", st.Version, member(st.Header.MemberId))
		switch {
		case len(st.Errors) > 0:
			status, detail = checkFail, "errors: "+strings.Join(st.Errors, "; ")
		case !versionAtLeast(st.Version, etcdstore.MinServerVersion):
			status, detail = checkFail, fmt.Sprintf("etcd %s is older than the provider's minimum %s", st.Version, etcdstore.MinServerVersion)
		case st.Leader == 0:
			status, detail = checkFail, "member has no leader"
		}
		d.add("endpoint "+s.endpoint, status, "%s", detail)
		if st.DbSizeQuota > 0 {
			pct := float64(st.DbSize) * 100 / float64(st.DbSizeQuota)
			status := checkOK
			if pct >= 80 {
				status = checkWarn
			}
			d.add("db size "+s.endpoint, status, "%s of quota %s (%.1f%%), %s in use", bytesText(st.DbSize), bytesText(st.DbSizeQuota), pct, bytesText(st.DbSizeInUse))
		} else {
			d.add("db size "+s.endpoint, checkInfo, "%s (%s in use); quota not reported by this server", bytesText(st.DbSize), bytesText(st.DbSizeInUse))
		}
	}
	switch len(leaders) {
	case 0:
		d.add("leader", checkFail, "no reachable member knows a leader")
	case 1:
		for id := range leaders {
			d.add("leader", checkOK, "%s", member(id))
		}
	default:
		ids := []string{}
		for id := range leaders {
			ids = append(ids, member(id))
		}
		d.add("leader", checkWarn, "members disagree on the leader: %s", strings.Join(ids, ", "))
	}
}

func doctorCluster(ctx context.Context, c *clientv3.Client, ns string, d *doctorView) {
	resp, err := c.Get(ctx, ns, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		d.add("quorum read", checkFail, "linearizable read failed: %v", err)
		return
	}
	d.add("quorum read", checkOK, "%d keys under %s at revision %d", resp.Count, ns, resp.Header.Revision)
	alarms, err := c.AlarmList(ctx)
	switch {
	case err != nil:
		d.add("alarms", checkFail, "cannot list alarms: %v", err)
	case len(alarms.Alarms) == 0:
		d.add("alarms", checkOK, "none")
	default:
		var list []string
		for _, a := range alarms.Alarms {
			list = append(list, fmt.Sprintf("%s on member %x", a.Alarm, a.MemberID))
		}
		d.add("alarms", checkFail, "%s (NOSPACE: compact, defragment, then disarm)", strings.Join(list, "; "))
	}
	doctorCompaction(ctx, c, ns, resp.Header.Revision, d)
}

// doctorCompaction finds the oldest revision still readable (the last
// compaction) by bisection over reads at a revision.
func doctorCompaction(ctx context.Context, c *clientv3.Client, ns string, current int64, d *doctorView) {
	probe := ns + "doctor-probe/compaction"
	readable := func(rev int64) (bool, error) {
		_, err := c.Get(ctx, probe, clientv3.WithRev(rev), clientv3.WithCountOnly())
		if errors.Is(err, rpctypes.ErrCompacted) {
			return false, nil
		}
		return err == nil, err
	}
	ok, err := readable(1)
	if err != nil {
		d.add("compaction", checkWarn, "unknown: %v", err)
		return
	}
	if ok {
		status := checkInfo
		detail := fmt.Sprintf("nothing compacted yet over %d revisions: auto-compaction is off or not due yet", current)
		if current > 100000 {
			status = checkWarn
			detail = fmt.Sprintf("nothing compacted over %d revisions: auto-compaction seems off (--auto-compaction-mode/--auto-compaction-retention)", current)
		}
		d.add("compaction", status, "%s", detail)
		return
	}
	lo, hi := int64(1), current // lo unreadable, hi readable
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		ok, err := readable(mid)
		if err != nil {
			d.add("compaction", checkWarn, "unknown: %v", err)
			return
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	d.add("compaction", checkOK, "compacted up to revision %d of %d: compaction runs", hi, current)
}

// doctorCapacityEpochs reports node lifecycles whose capacity entries
// changed after their capacity epoch last moved: a writer that does not put
// epochs (a build older than them, or a hand edit) wrote them, and a
// reservation fenced on the epoch cannot see such a change. Entries an older
// build left before an upgrade show up too, until the node's next capacity
// change moves its epoch past them.
func doctorCapacityEpochs(ctx context.Context, c *clientv3.Client, ns string, d *doctorView) {
	entries, rev, err := rangeAll(ctx, c, etcdstore.Prefix(ns, etcdstore.EntryCapacity))
	if err != nil {
		d.add("capacity epochs", checkWarn, "cannot read the capacity entries: %v", err)
		return
	}
	epochs, _, err := etcdpage.All(ctx, c, etcdstore.Prefix(ns, etcdstore.EntryCapacityEpoch), rev, 500)
	if err != nil {
		d.add("capacity epochs", checkWarn, "cannot read the capacity epochs: %v", err)
		return
	}
	type nodeLifecycle struct {
		node      authority.NodeDescriptor
		lifecycle int64
	}
	newest := map[nodeLifecycle]int64{}
	for _, kv := range entries {
		e, err := etcdstore.DecodeEntry(ns, kv)
		if err != nil {
			continue // a corrupt entry: the capacity command reports it
		}
		nl := nodeLifecycle{e.Node, e.Lifecycle}
		newest[nl] = max(newest[nl], kv.ModRevision)
	}
	epoch := map[nodeLifecycle]int64{}
	for _, kv := range epochs {
		if e, err := etcdstore.DecodeEntry(ns, kv); err == nil {
			epoch[nodeLifecycle{e.Node, e.Lifecycle}] = kv.ModRevision
		}
	}
	var behind []string
	for nl, r := range newest {
		if r > epoch[nl] {
			behind = append(behind, fmt.Sprintf("%s/%s/%d", nl.node.MeshName, nl.node.RID, nl.lifecycle))
		}
	}
	if len(behind) == 0 {
		d.add("capacity epochs", checkOK, "%d node lifecycle(s) with capacity entries, each epoch current", len(newest))
		return
	}
	slices.Sort(behind)
	d.add("capacity epochs", checkWarn, "%d of %d node lifecycle(s) have capacity entries newer than their epoch (%s): "+
		"written by a build that does not put capacity epochs; while such a writer runs, reservations on those nodes can "+
		"over-admit — upgrade every writer (entries left from before an upgrade clear with the node's next capacity change)",
		len(behind), len(newest), strings.Join(behind, ", "))
}

func doctorLimits(ctx context.Context, c *clientv3.Client, ns string, maxOps, maxBytes int, d *doctorView) {
	var nonce [6]byte
	_, _ = rand.Read(nonce[:])
	prefix := ns + "doctor-probe/" + hex.EncodeToString(nonce[:]) + "/"
	defer func() {
		_, _ = c.Delete(context.WithoutCancel(ctx), prefix, clientv3.WithPrefix())
	}()
	ops := make([]clientv3.Op, maxOps)
	for i := range ops {
		ops[i] = clientv3.OpPut(prefix+"txn/"+strconv.Itoa(i), "x")
	}
	_, err := c.Txn(ctx).Then(ops...).Commit()
	switch {
	case err == nil:
		d.add("max txn ops", checkOK, "the server accepts a Txn of %d operations (provider MaxTxnOps %d: aggregates of up to %d participants leaving one node, %d leaving as many nodes; owner removal in batches of %d rows)",
			maxOps, maxOps, (maxOps-4)/5, (maxOps-3)/6, maxOps/4)
	case errors.Is(err, rpctypes.ErrTooManyOps):
		d.add("max txn ops", checkFail, "the server refuses a Txn of %d operations: raise the server's --max-txn-ops or lower the provider's MaxTxnOps (≥ 8)", maxOps)
	default:
		d.add("max txn ops", checkFail, "probe failed: %v", err)
	}
	// one Put whose request is just under maxBytes
	size := maxBytes - len(prefix) - 512
	if size < 1 {
		d.add("max request bytes", checkFail, "--max-request-bytes %d is too small to probe", maxBytes)
		return
	}
	_, err = c.Put(ctx, prefix+"request", strings.Repeat("x", size))
	switch {
	case err == nil:
		d.add("max request bytes", checkOK, "the server accepts a request of %s (provider MaxRequestBytes %s; payloads are up to 1 MiB)", bytesText(int64(size)), bytesText(int64(maxBytes)))
	case errors.Is(err, rpctypes.ErrRequestTooLarge):
		d.add("max request bytes", checkFail, "the server refuses a request of %s: raise the server's --max-request-bytes to at least %d or lower the provider's MaxRequestBytes", bytesText(int64(size)), maxBytes)
	default:
		d.add("max request bytes", checkFail, "probe failed: %v", err)
	}
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// versionAtLeast compares dotted versions ("3.7.3" ≥ "3.5.0").
func versionAtLeast(v, min string) bool {
	parse := func(s string) [3]int {
		var out [3]int
		for i, part := range strings.SplitN(strings.SplitN(s, "-", 2)[0], ".", 3) {
			out[i], _ = strconv.Atoi(part)
		}
		return out
	}
	a, b := parse(v), parse(min)
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i]
		}
	}
	return true
}
