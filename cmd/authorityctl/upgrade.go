package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// processView is one announced process (its leases grouped) or one owner
// lease no process announced.
type processView struct {
	Role  string `json:"role"`
	Build string `json:"build"`
	Host  string `json:"host,omitempty"`
	PID   int    `json:"pid,omitempty"`
	// Node is the mesh/RID@lifecycle of an owner no process announced.
	Node      string   `json:"node,omitempty"`
	MinVer    int32    `json:"minVersion"`
	MaxVer    int32    `json:"maxVersion"`
	Leases    int      `json:"leases"`
	Owners    []string `json:"owners,omitempty"`
	Announced bool     `json:"announced"`
}

// upgradeView is `upgrade status`: the active version, the newest one every
// live process supports, and who runs what.
type upgradeView struct {
	Namespace string        `json:"namespace"`
	Active    int32         `json:"activeVersion"`
	Ceiling   int32         `json:"finalizableTo"`
	ThisBuild int32         `json:"thisBuildLatest"`
	Processes []processView `json:"processes"`
	Finalized *bool         `json:"finalized,omitempty"`
	DryRun    bool          `json:"dryRun,omitempty"`
	MovedFrom int32         `json:"movedFrom,omitempty"`
	MovedTo   int32         `json:"movedTo,omitempty"`
	BlockedBy []string      `json:"blockedBy,omitempty"`
	// Incompatible names each live process that cannot work at the active
	// version (an earlier build after finalize): upgrade status fails.
	Incompatible []string `json:"incompatible,omitempty"`
	Revision     int64    `json:"revision"`
}

func newUpgradeCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "upgrade",
		Short: "Show the store versions of a namespace, and finalize a rolling upgrade",
		Long: `A namespace has one active store version: every writer writes its format
and follows its fence rules. Every running store (and authorityctl, when it
writes) announces the versions it works at; an owner lease with no
announcement is an earlier build's. "upgrade status" lists them; "upgrade
finalize" moves the active version forward once every live process supports
it. Before finalize, every node can go back to the previous release; after
it, builds that do not support the new version refuse to start.`,
	}
	cmd.AddCommand(newUpgradeStatusCommand(g), newUpgradeFinalizeCommand(g))
	return cmd
}

func newUpgradeStatusCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "List who runs what on the namespace, and the version finalize can move to",
		Long: `List the namespace's active store version, the newest every live process
supports, and who runs what. Exits 1 when a live process cannot work at the
active version: an earlier build's owner on a finalized namespace (named
with its node on stderr).`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.raw(cmd, func(ctx context.Context, c *clientv3.Client) error {
				u, err := etcdstore.ReadUpgradeStatus(ctx, c, g.namespace)
				if err != nil {
					return err
				}
				v := upgradeViewOf(u)
				v.Incompatible = incompatible(ctx, c, u, u.Active)
				g.foundNothing = len(v.Processes) == 0 && u.Active == storeversion.Base
				if err := renderUpgrade(g, v); err != nil {
					return err
				}
				return incompatibleError(u, v.Incompatible)
			})
		},
	}
}

func newUpgradeFinalizeCommand(g *globals) *cobra.Command {
	var yes, dryRun bool
	var to int
	cmd := &cobra.Command{
		Use:         "finalize (--dry-run | --yes) [--to VERSION]",
		Annotations: map[string]string{annotationWrites: "with --yes: moves the namespace's active store version forward"},
		Short:       "Move the namespace's active store version forward",
		Long: `Move the namespace's active store version to --to (default: the newest this
build knows), in one fenced transaction, once every live process announces
support for it and no owner lease of an earlier build is live. It never moves
a version back. After it, a build that does not support the new version
refuses to start on the namespace: finalize only when no node will go back.
--dry-run says what would happen and writes nothing.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if yes == dryRun {
				return usageError(errors.New("upgrade finalize writes: pass exactly one of --yes or --dry-run"))
			}
			target := storeversion.Latest
			if cmd.Flags().Changed("to") {
				target = storeversion.Version(to)
				if !storeversion.Known(target) {
					return usageError(fmt.Errorf("--to %d: this build knows store versions %d to %d",
						to, storeversion.MinSupported, storeversion.Latest))
				}
			}
			return g.withStore(cmd, yes, func(ctx context.Context, s *etcdstore.Store, c *clientv3.Client) error {
				res, err := s.Finalize(ctx, target, dryRun)
				v := upgradeViewOf(res.Status)
				moved := res.Moved
				v.Finalized, v.DryRun, v.MovedFrom, v.MovedTo = &moved, dryRun, int32(res.From), int32(res.To)
				g.foundNothing = len(v.Processes) == 0 && res.Status.Active == storeversion.Base
				if errors.Is(err, etcdstore.ErrFinalizeBlocked) {
					v.BlockedBy, v.MovedTo = incompatible(ctx, c, res.Status, target), int32(target)
					_ = renderUpgrade(g, v)
					return blockedError(res.Status, target, v.BlockedBy)
				}
				if err != nil {
					return err
				}
				return renderUpgrade(g, v)
			})
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "really move the active version")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only check, and say what would move")
	cmd.Flags().IntVar(&to, "to", int(storeversion.Latest), "the store version to move to")
	return cmd
}

// upgradeViewOf groups u's announcements by process.
func upgradeViewOf(u etcdstore.UpgradeStatus) upgradeView {
	v := upgradeView{Namespace: u.Namespace, Active: int32(u.Active), Ceiling: int32(u.Ceiling()),
		ThisBuild: int32(storeversion.Latest), Revision: u.Revision, Processes: []processView{}}
	if len(u.Announced) == 0 && len(u.Unannounced) == 0 {
		v.Ceiling = int32(storeversion.Latest)
	}
	byProcess := map[string]int{}
	for _, a := range u.Announced {
		id := fmt.Sprintf("%s/%d/%s", a.Host, a.PID, a.Started)
		i, ok := byProcess[id]
		if !ok {
			i = len(v.Processes)
			byProcess[id] = i
			v.Processes = append(v.Processes, processView{Role: a.Role, Build: a.Build, Host: a.Host, PID: a.PID,
				MinVer: a.Min, MaxVer: a.Max, Announced: true})
		}
		v.Processes[i].Leases++
		for _, o := range a.Owners {
			v.Processes[i].Owners = append(v.Processes[i].Owners, o.OwnerID+"/"+strconv.FormatInt(o.LeaseGeneration, 10))
		}
	}
	for _, o := range u.Unannounced {
		v.Processes = append(v.Processes, processView{Role: "owner (no announcement)", Build: "earlier build",
			Node:   nodeText(o.Node, o.Lifecycle),
			MinVer: int32(storeversion.Base), MaxVer: int32(storeversion.Base), Leases: 1,
			Owners: []string{o.Owner.OwnerID + "/" + strconv.FormatInt(o.Owner.LeaseGeneration, 10)}})
	}
	return v
}

func renderUpgrade(g *globals, v upgradeView) error {
	t := &table{header: []string{"ROLE", "BUILD", "HOST", "PID", "VERSIONS", "LEASES", "OWNERS"}}
	for _, p := range v.Processes {
		pid, host := "", p.Host
		if p.PID != 0 {
			pid = strconv.Itoa(p.PID)
		}
		if p.Node != "" {
			host = "node " + p.Node
		}
		t.add(p.Role, p.Build, host, pid, fmt.Sprintf("%d-%d", p.MinVer, p.MaxVer), strconv.Itoa(p.Leases), strings.Join(p.Owners, ","))
	}
	if g.output == outputTable || g.output == outputWide {
		// who is in the way (BlockedBy, Incompatible) is said once, in the
		// command's error on stderr
		ceiling := fmt.Sprintf("; every live process supports up to %d", v.Ceiling)
		if len(v.Incompatible) > 0 || len(v.BlockedBy) > 0 {
			ceiling = ""
		}
		fmt.Fprintf(g.stdout, "namespace %s: active store version %s%s; this build knows up to %s\n",
			v.Namespace, storeversion.Version(v.Active), ceiling, storeversion.Latest)
		switch {
		case v.Finalized == nil, len(v.BlockedBy) > 0:
		case v.DryRun && v.MovedTo > v.MovedFrom:
			fmt.Fprintf(g.stdout, "finalize would move the active version from %d to %d\n", v.MovedFrom, v.MovedTo)
		case *v.Finalized:
			fmt.Fprintf(g.stdout, "finalized: active store version moved from %d to %d\n", v.MovedFrom, v.MovedTo)
		default:
			fmt.Fprintf(g.stdout, "nothing to finalize: the active version is already %d\n", v.MovedTo)
		}
	}
	return render(g.stdout, g.output, v, t)
}

// errIncompatible is the failure of upgrade status and doctor when a live
// process cannot work at the namespace's active store version.
var errIncompatible = errors.New("a live process cannot work at the namespace's active store version")

// incompatible names each live process of u that does not work at version
// v (an owner no process announced works at Base only), with its node or
// host and the time its lease has left.
func incompatible(ctx context.Context, c *clientv3.Client, u etcdstore.UpgradeStatus, v storeversion.Version) []string {
	var out []string
	for _, a := range u.Announced {
		if !a.Supports(v) {
			out = append(out, fmt.Sprintf("%s %s (pid %d on host %s; lease %x, %s) works at store versions %d to %d",
				a.Role, a.Build, a.PID, a.Host, a.Lease, leaseLeft(ctx, c, a.Lease), a.Min, a.Max))
		}
	}
	if v == storeversion.Base {
		return out
	}
	for _, o := range u.Unannounced {
		out = append(out, fmt.Sprintf("owner %s generation %d on node %s (lease %x, %s) has no announcement: an earlier build, which works at store version %d only",
			o.Owner.OwnerID, o.Owner.LeaseGeneration, nodeText(o.Node, o.Lifecycle), o.Lease, leaseLeft(ctx, c, o.Lease), storeversion.Base))
	}
	return out
}

// incompatibleError is upgrade status's failure when who is not empty.
func incompatibleError(u etcdstore.UpgradeStatus, who []string) error {
	if len(who) == 0 {
		return nil
	}
	return fmt.Errorf("%w: namespace %s is at store version %s, and these live processes cannot work at it:\n  %s\n"+
		"an earlier build on a finalized namespace does not read its active version: stop each one named, and run a build that supports version %d in its place",
		errIncompatible, u.Namespace, u.Active, strings.Join(who, "\n  "), u.Active)
}

// blockedError is upgrade finalize's failure when the processes named in
// who do not support target.
func blockedError(u etcdstore.UpgradeStatus, target storeversion.Version, who []string) error {
	return fmt.Errorf("%w: %s cannot move to store version %s while these live processes do not support it:\n  %s\n"+
		"upgrade each one named (an owner lease of a process that is gone ends by itself when its time runs out), then run finalize again; nothing was written",
		etcdstore.ErrFinalizeBlocked, u.Namespace, target, strings.Join(who, "\n  "))
}

// leaseLeft says how long lease has left ("57s left", "expired").
func leaseLeft(ctx context.Context, c *clientv3.Client, lease int64) string {
	ttl, err := c.TimeToLive(ctx, clientv3.LeaseID(lease))
	switch {
	case err != nil:
		return "time left unknown"
	case ttl.TTL < 0:
		return "expired"
	}
	return age(time.Duration(ttl.TTL)*time.Second) + " left"
}

// nodeText is a node lifecycle as tables print it: mesh/RID@lifecycle.
func nodeText(n authority.NodeDescriptor, lifecycle int64) string {
	return fmt.Sprintf("%s/%s@%d", n.MeshName, n.RID, lifecycle)
}

// doctorStoreVersions reports the namespace's active store version and who
// runs what on it (upgrade status in one line): a failure when a live
// process cannot work at the active version.
func doctorStoreVersions(ctx context.Context, c *clientv3.Client, ns string, d *doctorView) {
	u, err := etcdstore.ReadUpgradeStatus(ctx, c, ns)
	if err != nil {
		d.add("store versions", checkWarn, "cannot read the store versions: %v", err)
		return
	}
	v := upgradeViewOf(u)
	var who []string
	for _, p := range v.Processes {
		if p.Node != "" {
			who = append(who, fmt.Sprintf("%s %s on node %s (owner %s)", p.Role, p.Build, p.Node, strings.Join(p.Owners, ",")))
			continue
		}
		who = append(who, fmt.Sprintf("%s %s on %s pid %d (versions %d-%d, %d lease(s))", p.Role, p.Build, p.Host, p.PID, p.MinVer, p.MaxVer, p.Leases))
	}
	if len(who) == 0 {
		who = append(who, "no live process")
	}
	status, note := checkOK, ""
	bad := incompatible(ctx, c, u, u.Active)
	switch {
	case !storeversion.Known(u.Active):
		status, note = checkWarn, fmt.Sprintf("; this authorityctl knows versions up to %d: use a newer one", storeversion.Latest)
	case len(bad) > 0:
		status, who, note = checkFail, bad, fmt.Sprintf("; a build that cannot work at the active version runs on the namespace "+
			"(an earlier build after finalize): stop each one named, and run a build that supports version %d in its place", u.Active)
	case len(u.Unannounced) > 0:
		status, note = checkWarn, fmt.Sprintf("; %d owner lease(s) of an earlier build: finalize waits for them", len(u.Unannounced))
	case v.Ceiling > v.Active && int32(storeversion.Latest) > v.Active:
		note = fmt.Sprintf("; every live process supports %d: `authorityctl upgrade finalize --dry-run` shows the move", min(v.Ceiling, int32(storeversion.Latest)))
	}
	d.add("store versions", status, "active store version %s; %s%s", u.Active, strings.Join(who, "; "), note)
}
