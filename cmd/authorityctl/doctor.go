package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/etcdpage"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/preflight"
	"github.com/zlink-systems/authority/provider/etcd/schema"
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

// Doctor limit profiles: what --max-txn-ops and --max-request-bytes default
// to.
var doctorProfiles = map[string]struct{ maxTxnOps, maxRequestBytes int }{
	"production":    {preflight.RecommendedMaxTxnOps, preflight.RecommendedMaxRequestBytes},
	"etcd-defaults": {etcdstore.DefaultMaxTxnOps, etcdstore.DefaultMaxRequestBytes},
}

func newDoctorCommand(g *globals) *cobra.Command {
	var maxTxnOps, maxRequestBytes int
	var noProbe bool
	var profile string
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check the etcd cluster against what the authority store needs",
		Long: `Check cluster health and version per endpoint, the leader, DB size against
the quota, alarms, whether compaction runs, whether the server accepts the
Txn size (--max-txn-ops) and request size (--max-request-bytes) the provider is
configured with, and whether every node's capacity epoch is at least as new
as its capacity entries (an entry newer than its node's epoch was written by a
build that does not put epochs). It prints the lease-checkpoint flags in the
spelling of the etcd version each member reports.

The limits checked are those of --profile: production (the default: 1024 ops,
4 MiB, what the README asks of production clusters) or etcd-defaults (128 ops,
1.5 MiB); --max-txn-ops and --max-request-bytes override them. The probes are
Txns whose compare never holds: the server checks their size and operation
count before it evaluates the compare, so they write no key and no revision
(each passes through the raft log like any Txn). --no-probe skips them.
Exits 1 when a check fails.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, ok := doctorProfiles[profile]
			if !ok {
				return usageError(fmt.Errorf("unknown --profile %q: accepted production, etcd-defaults", profile))
			}
			if !cmd.Flags().Changed("max-txn-ops") {
				maxTxnOps = p.maxTxnOps
			}
			if !cmd.Flags().Changed("max-request-bytes") {
				maxRequestBytes = p.maxRequestBytes
			}
			if err := intRange("--max-txn-ops", int64(maxTxnOps), minProbeTxnOps, maxProbeTxnOps); err != nil {
				return err
			}
			if err := intRange("--max-request-bytes", int64(maxRequestBytes), minProbeRequestBytes, maxProbeRequestBytes); err != nil {
				return err
			}
			g.sendLimit = maxRequestBytes + 1024*1024
			if g.shards != nil {
				return runDoctorShards(cmd.Context(), g, maxTxnOps, maxRequestBytes, noProbe)
			}
			return runDoctor(cmd.Context(), g, maxTxnOps, maxRequestBytes, noProbe)
		},
	}
	cmd.Flags().StringVar(&profile, "profile", "production", "limits to check: production (1024 ops, 4 MiB) or etcd-defaults (128 ops, 1.5 MiB)")
	cmd.Flags().IntVar(&maxTxnOps, "max-txn-ops", preflight.RecommendedMaxTxnOps,
		fmt.Sprintf("the provider's MaxTxnOps to verify (%d..%d; default: that of --profile)", minProbeTxnOps, maxProbeTxnOps))
	cmd.Flags().IntVar(&maxRequestBytes, "max-request-bytes", preflight.RecommendedMaxRequestBytes,
		fmt.Sprintf("the provider's MaxRequestBytes to verify (%d..%d; default: that of --profile)", minProbeRequestBytes, maxProbeRequestBytes))
	cmd.Flags().BoolVar(&noProbe, "no-probe", false, "skip the probes of the limits")
	return cmd
}

func runDoctor(ctx context.Context, g *globals, maxTxnOps, maxRequestBytes int, noProbe bool) error {
	ctx, cancel := g.commandContext(ctx)
	defer cancel()
	c, statuses, err := g.dial(ctx, true)
	if err != nil {
		return err
	}
	defer c.Close()
	d := &doctorView{Endpoints: []memberView{}, Checks: []checkView{}}
	doctorChecks(ctx, g, c, statuses, d, maxTxnOps, maxRequestBytes, noProbe)
	doctorLeaseCheckpoint(d)
	return finishDoctor(g, d)
}

// doctorChecks runs the checks of one cluster and its namespace into d.
func doctorChecks(ctx context.Context, g *globals, c *clientv3.Client, statuses []endpointStatus, d *doctorView,
	maxTxnOps, maxRequestBytes int, noProbe bool) {
	doctorMembers(ctx, c, statuses, d)
	doctorServerWarnings(d)
	if doctorCluster(ctx, c, g.namespace, d) == 0 {
		g.warnEmpty()
	}
	doctorCapacityEpochs(ctx, c, g.namespace, d)
	doctorStoreVersions(ctx, c, g.namespace, d)
	doctorKeys(ctx, c, g.namespace, d)
	if noProbe {
		d.add("limits", checkInfo, "probes skipped (--no-probe)")
	} else {
		doctorLimits(ctx, c, g.namespace, maxTxnOps, maxRequestBytes, d)
	}
}

// finishDoctor prints d and fails when a check failed.
func finishDoctor(g *globals, d *doctorView) error {
	failed := 0
	for _, ch := range d.Checks {
		if ch.Status == checkFail {
			failed++
		}
	}
	if err := render(g.stdout, g.output, d, doctorTable(d, g.output == outputWide)); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("doctor: %d check(s) failed", failed)
	}
	return nil
}

// doctorTable is the checks table; -o wide prints each endpoint's member,
// version, leader, raft index and DB sizes before it.
func doctorTable(d *doctorView, wide bool) *table {
	t := &table{header: []string{"CHECK", "STATUS", "DETAIL"}}
	if wide {
		ep := &table{header: []string{"ENDPOINT", "MEMBER", "VERSION", "LEADER", "RAFT-INDEX", "DB-SIZE", "IN-USE", "QUOTA", "ERROR"}}
		for _, m := range d.Endpoints {
			ep.add(m.Endpoint, orDash(m.MemberID), orDash(m.Version), orDash(m.Leader), strconv.FormatUint(m.RaftIndex, 10),
				bytesText(m.DBSize), bytesText(m.DBSizeInUse), bytesText(m.DBSizeQuota), orDash(m.Error))
		}
		t.before = ep
	}
	for _, ch := range d.Checks {
		t.add(ch.Check, ch.Status, ch.Detail)
	}
	return t
}

// doctorLeaseCheckpoint gives the lease-checkpoint flags for each etcd
// version the members report (a flag a server does not know stops it).
func doctorLeaseCheckpoint(d *doctorView) {
	var versions []string
	for _, m := range d.Endpoints {
		if m.Version != "" && !slices.Contains(versions, m.Version) {
			versions = append(versions, m.Version)
		}
	}
	if len(versions) == 0 {
		versions = []string{""}
	}
	for _, v := range versions {
		var args []string
		for _, r := range preflight.LeaseCheckpointRequirements(v) {
			args = append(args, r.Arg())
		}
		name := "etcd " + v
		if v == "" {
			name = "etcd 3.6+"
		}
		d.add("lease checkpointing", checkInfo, "not detectable through the client API; run %s members with %s "+
			"so leader changes do not extend owner leases", name, strings.Join(args, " "))
	}
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
		case !preflight.ServerVersionAtLeast(st.Version, preflight.MinServerVersion):
			status, detail = checkFail, fmt.Sprintf("etcd %s is older than the provider's minimum %s", st.Version, preflight.MinServerVersion)
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

// doctorCluster checks a quorum read, the alarms and compaction; it returns
// how many keys the namespace holds (-1: unknown).
func doctorCluster(ctx context.Context, c *clientv3.Client, ns string, d *doctorView) int64 {
	resp, err := c.Get(ctx, ns, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		d.add("quorum read", checkFail, "linearizable read failed: %v", err)
		return -1
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
	return resp.Count
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
	entries, rev, err := rangeAll(ctx, c, schema.Prefix(ns, schema.EntryCapacity))
	if err != nil {
		d.add("capacity epochs", checkWarn, "cannot read the capacity entries: %v", err)
		return
	}
	epochs, _, err := etcdpage.All(ctx, c, schema.Prefix(ns, schema.EntryCapacityEpoch), rev, 500)
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
		e, err := schema.DecodeEntry(ns, kv)
		if err != nil {
			continue // a corrupt entry: the capacity command reports it
		}
		nl := nodeLifecycle{e.Node, e.Lifecycle}
		newest[nl] = max(newest[nl], kv.ModRevision)
	}
	epoch := map[nodeLifecycle]int64{}
	for _, kv := range epochs {
		if e, err := schema.DecodeEntry(ns, kv); err == nil {
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

// doctorLimits probes the server's --max-txn-ops and --max-request-bytes
// with Txns whose compare never holds (a key's version below 0): etcd checks
// the operation count (at its API) and the request size (before proposing)
// ahead of evaluating compares, so a refused limit is reported while an
// accepted probe writes nothing.
func doctorLimits(ctx context.Context, c *clientv3.Client, ns string, maxOps, maxBytes int, d *doctorView) {
	var nonce [6]byte
	_, _ = rand.Read(nonce[:])
	prefix := ns + "doctor-probe/" + hex.EncodeToString(nonce[:]) + "/"
	never := clientv3.Compare(clientv3.Version(prefix+"never"), "<", 0)
	ops := make([]clientv3.Op, maxOps)
	for i := range ops {
		ops[i] = clientv3.OpPut(prefix+"txn/"+strconv.Itoa(i), "x")
	}
	resp, err := c.Txn(ctx).If(never).Then(ops...).Commit()
	switch {
	case err == nil && resp.Succeeded:
		d.add("max txn ops", checkFail, "a compare that cannot hold succeeded: the server is not etcd-compatible")
	case err == nil:
		d.add("max txn ops", checkOK, "the server accepts a Txn of %d operations (provider MaxTxnOps %d: aggregates of up to %d participants leaving one node, %d leaving as many nodes; owner removal in batches of %d rows)",
			maxOps, maxOps, (maxOps-4)/5, (maxOps-4)/6, maxOps/5)
	case errors.Is(err, rpctypes.ErrTooManyOps):
		d.add("max txn ops", checkFail, "the server refuses a Txn of %d operations: its --max-txn-ops is lower; raise it to at least %d or lower the provider's MaxTxnOps (>= 8)", maxOps, maxOps)
	default:
		d.add("max txn ops", checkFail, "probe failed: %v", err)
	}
	// one Put whose request is just under maxBytes
	size := maxBytes - len(prefix) - 512
	resp, err = c.Txn(ctx).If(never).Then(clientv3.OpPut(prefix+"request", strings.Repeat("x", size))).Commit()
	switch {
	case err == nil && resp.Succeeded:
		d.add("max request bytes", checkFail, "a compare that cannot hold succeeded: the server is not etcd-compatible")
	case err == nil:
		d.add("max request bytes", checkOK, "the server accepts a request of %s (provider MaxRequestBytes %s; payloads are up to 1 MiB)", bytesText(int64(size)), bytesText(int64(maxBytes)))
	default:
		d.add("max request bytes", checkFail, "%s", requestSizeFailure(err, size, maxBytes))
	}
}

// grpcSizeError matches gRPC's message-size errors: "grpc: received message
// larger than max (4193806 vs. 2097152)" (the server's receive limit) and
// "grpc: trying to send message larger than max (…)" (this client's send
// limit).
var grpcSizeError = regexp.MustCompile(`(received|trying to send) message larger than max \((\d+) vs\. (\d+)\)`)

// requestSizeFailure says which limit, on which side, refused the request
// probe of size bytes.
func requestSizeFailure(err error, size, maxBytes int) string {
	if errors.Is(err, rpctypes.ErrRequestTooLarge) {
		return fmt.Sprintf("the server refuses a request of %s: its --max-request-bytes is below the provider's MaxRequestBytes %d; "+
			"raise the server's --max-request-bytes to at least %d or lower the provider's MaxRequestBytes", bytesText(int64(size)), maxBytes, maxBytes)
	}
	m := grpcSizeError.FindStringSubmatch(err.Error())
	if m == nil {
		return fmt.Sprintf("probe failed: %v", err)
	}
	got, _ := strconv.ParseInt(m[2], 10, 64)
	limit, _ := strconv.ParseInt(m[3], 10, 64)
	if m[1] == "trying to send" {
		return fmt.Sprintf("this client would not send a request of %s: its send limit (MaxCallSendMsgSize) is %s; "+
			"the provider's client needs a send limit above MaxRequestBytes %d", bytesText(got), bytesText(limit), maxBytes)
	}
	return fmt.Sprintf("the server refuses a request of %s at its gRPC receive limit of %s (its --max-request-bytes + 512 KiB, "+
		"so --max-request-bytes is about %s): raise the server's --max-request-bytes to at least %d or lower the provider's MaxRequestBytes",
		bytesText(got), bytesText(limit), bytesText(limit-512*1024), maxBytes)
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
