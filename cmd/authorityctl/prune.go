package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/spf13/cobra"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// epochView is one node lifecycle's capacity epoch.
type epochView struct {
	Mesh      string `json:"mesh"`
	Node      string `json:"node"`
	Lifecycle int64  `json:"lifecycle"`
}

// pruneView is what prune-epochs would delete (--dry-run) or deleted
// (--yes: Pruned is the store's count, Epochs the epochs present before and
// gone after).
type pruneView struct {
	DryRun bool        `json:"dryRun"`
	Epochs []epochView `json:"epochs"`
	Pruned *int        `json:"pruned,omitempty"`
}

func newPruneEpochsCommand(g *globals) *cobra.Command {
	var yes, dryRun bool
	cmd := &cobra.Command{
		Use:         "prune-epochs (--dry-run | --yes)",
		Annotations: map[string]string{annotationWrites: "with --yes: deletes the capacity epochs of node lifecycles that hold no capacity"},
		Short:       "Delete the capacity epochs of node lifecycles that hold no capacity",
		Long: `Delete the capacity epoch key of every node lifecycle that holds no
capacity entry (the store's PruneCapacityEpochs), and every owner directory key
that names no placement key (store version 4). Every node restart is a new
lifecycle, and each lifecycle that ever held capacity leaves its epoch key
behind until it is pruned. Each delete is fenced on the node's capacity range
being empty, so it is safe next to running stores. This is an operator
write: it needs --yes; --dry-run lists the epochs it would delete now.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if yes == dryRun {
				return usageError(errors.New("prune-epochs writes: pass exactly one of --yes or --dry-run"))
			}
			return g.withStore(cmd, yes, func(ctx context.Context, s *etcdstore.Store, c *clientv3.Client) error {
				if yes {
					return pruneEpochs(ctx, g, s, c)
				}
				q := entryQuery{
					prefix: schema.Prefix(g.namespace, schema.EntryCapacityEpoch), opts: []clientv3.OpOption{clientv3.WithKeysOnly()},
					undecodable: func(err error) { fmt.Fprintf(g.stderr, "warning: %v\n", err) }, // --yes leaves it too, and reports it
				}
				epochs, err := listEntries(ctx, c, g.namespace, q, func(le listedEntry) (epochView, bool, error) {
					e := le.entry
					held, err := c.Get(ctx, schema.CapacityNodePrefix(g.namespace, e.Node, e.Lifecycle), clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly())
					if err != nil {
						return epochView{}, false, err
					}
					return epochView{Mesh: e.Node.MeshName, Node: e.Node.RID, Lifecycle: e.Lifecycle}, len(held.Kvs) == 0, nil
				})
				if err != nil {
					return err
				}
				out := pruneView{DryRun: true, Epochs: epochs}
				g.foundNothing = len(epochs) == 0
				t := addRows(epochsTable(), epochs, (*table).addEpoch)
				if g.output == outputTable || g.output == outputWide {
					fmt.Fprintf(g.stdout, "would prune %d capacity epochs:\n", len(out.Epochs))
				}
				return render(g.stdout, g.output, out, t)
			})
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "really delete the epochs")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only list the epochs that would be deleted")
	return cmd
}

// pruneEpochs deletes the prunable epochs and lists the epochs that were
// there before and are gone after.
func pruneEpochs(ctx context.Context, g *globals, s *etcdstore.Store, c *clientv3.Client) error {
	before, err := listEpochs(ctx, g, c)
	if err != nil {
		return err
	}
	n, err := s.PruneCapacityEpochs(ctx)
	if err != nil {
		return fmt.Errorf("pruned %d capacity epochs, then: %w", n, err)
	}
	after, err := listEpochs(ctx, g, c)
	if err != nil {
		return err
	}
	out := pruneView{Epochs: []epochView{}, Pruned: &n}
	for _, e := range before {
		if !slices.Contains(after, e) {
			out.Epochs = append(out.Epochs, e)
		}
	}
	t := addRows(epochsTable(), out.Epochs, (*table).addEpoch)
	if g.output == outputTable || g.output == outputWide {
		fmt.Fprintf(g.stdout, "pruned %d keys (capacity epochs and empty owner directories); the epochs:\n", n)
	}
	return render(g.stdout, g.output, out, t)
}

// listEpochs lists every capacity epoch key (undecodable ones are skipped).
func listEpochs(ctx context.Context, g *globals, c *clientv3.Client) ([]epochView, error) {
	q := entryQuery{
		prefix: schema.Prefix(g.namespace, schema.EntryCapacityEpoch), opts: []clientv3.OpOption{clientv3.WithKeysOnly()},
		undecodable: func(error) {},
	}
	return listEntries(ctx, c, g.namespace, q, func(le listedEntry) (epochView, bool, error) {
		return epochView{Mesh: le.entry.Node.MeshName, Node: le.entry.Node.RID, Lifecycle: le.entry.Lifecycle}, true, nil
	})
}

func epochsTable() *table { return &table{header: []string{"MESH", "NODE", "LIFECYCLE"}} }

func (t *table) addEpoch(e epochView) {
	t.add(e.Mesh, e.Node, strconv.FormatInt(e.Lifecycle, 10))
}
