package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// processView is one announced process (its leases grouped) or one owner
// lease no process announced.
type processView struct {
	Role      string   `json:"role"`
	Build     string   `json:"build"`
	Host      string   `json:"host,omitempty"`
	PID       int      `json:"pid,omitempty"`
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
	Revision  int64         `json:"revision"`
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
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := g.commandContext(cmd.Context())
			defer cancel()
			c, _, err := g.dial(ctx, false)
			if err != nil {
				return err
			}
			defer func() { _ = c.Close() }()
			u, err := etcdstore.ReadUpgradeStatus(ctx, c, g.namespace)
			if err != nil {
				return err
			}
			return renderUpgrade(g, upgradeViewOf(u))
		},
	}
}

func newUpgradeFinalizeCommand(g *globals) *cobra.Command {
	var yes, dryRun bool
	var to int
	cmd := &cobra.Command{
		Use:   "finalize (--dry-run | --yes) [--to VERSION]",
		Short: "Move the namespace's active store version forward",
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
			return g.withStore(cmd, func(ctx context.Context, s *etcdstore.Store, _ *clientv3.Client) error {
				res, err := s.Finalize(ctx, target, dryRun)
				v := upgradeViewOf(res.Status)
				moved := res.Moved
				v.Finalized, v.DryRun, v.MovedFrom, v.MovedTo = &moved, dryRun, int32(res.From), int32(res.To)
				if errors.Is(err, etcdstore.ErrFinalizeBlocked) {
					v.BlockedBy, v.MovedTo = res.Status.Blockers(target), int32(target)
					_ = renderUpgrade(g, v)
					return err
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
			MinVer: int32(storeversion.Base), MaxVer: int32(storeversion.Base), Leases: 1,
			Owners: []string{o.Owner.OwnerID + "/" + strconv.FormatInt(o.Owner.LeaseGeneration, 10)}})
	}
	return v
}

func renderUpgrade(g *globals, v upgradeView) error {
	t := &table{header: []string{"ROLE", "BUILD", "HOST", "PID", "VERSIONS", "LEASES", "OWNERS"}}
	for _, p := range v.Processes {
		pid := ""
		if p.PID != 0 {
			pid = strconv.Itoa(p.PID)
		}
		t.add(p.Role, p.Build, p.Host, pid, fmt.Sprintf("%d-%d", p.MinVer, p.MaxVer), strconv.Itoa(p.Leases), strings.Join(p.Owners, ","))
	}
	if g.output == outputTable || g.output == outputWide {
		fmt.Fprintf(g.stdout, "namespace %s: active store version %s; every live process supports up to %d; this build knows up to %s\n",
			v.Namespace, storeversion.Version(v.Active), v.Ceiling, storeversion.Latest)
		switch {
		case v.Finalized == nil:
		case len(v.BlockedBy) > 0:
			fmt.Fprintf(g.stdout, "finalize to %d is blocked by:\n  %s\n", v.MovedTo, strings.Join(v.BlockedBy, "\n  "))
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

// doctorStoreVersions reports the namespace's active store version and who
// runs what on it (upgrade status in one line).
func doctorStoreVersions(ctx context.Context, c *clientv3.Client, ns string, d *doctorView) {
	u, err := etcdstore.ReadUpgradeStatus(ctx, c, ns)
	if err != nil {
		d.add("store versions", checkWarn, "cannot read the store versions: %v", err)
		return
	}
	v := upgradeViewOf(u)
	var who []string
	for _, p := range v.Processes {
		who = append(who, fmt.Sprintf("%s %s on %s pid %d (versions %d-%d, %d lease(s))", p.Role, p.Build, p.Host, p.PID, p.MinVer, p.MaxVer, p.Leases))
	}
	if len(who) == 0 {
		who = append(who, "no live process")
	}
	status, note := checkOK, ""
	switch {
	case !storeversion.Known(u.Active):
		status, note = checkWarn, fmt.Sprintf("; this authorityctl knows versions up to %d: use a newer one", storeversion.Latest)
	case len(u.Unannounced) > 0:
		status, note = checkWarn, fmt.Sprintf("; %d owner lease(s) of an earlier build: finalize waits for them", len(u.Unannounced))
	case v.Ceiling > v.Active && int32(storeversion.Latest) > v.Active:
		note = fmt.Sprintf("; every live process supports %d: `authorityctl upgrade finalize --dry-run` shows the move", min(v.Ceiling, int32(storeversion.Latest)))
	}
	d.add("store versions", status, "active store version %s; %s%s", u.Active, strings.Join(who, "; "), note)
}
