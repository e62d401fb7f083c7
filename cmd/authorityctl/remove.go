package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/spf13/cobra"
	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// removalView is what remove-owner would do (--dry-run: Rows) or did
// (--yes: Removed, the number of rows deleted).
type removalView struct {
	OwnerID         string     `json:"ownerId"`
	LeaseGeneration int64      `json:"leaseGeneration"`
	DryRun          bool       `json:"dryRun"`
	Rows            *[]rowView `json:"rows,omitempty"`
	Removed         *int64     `json:"removed,omitempty"`
}

func newRemoveOwnerCommand(g *globals) *cobra.Command {
	var gen int64
	var yes, dryRun, force bool
	cmd := &cobra.Command{
		Use:         "remove-owner OWNER --lease-generation N (--dry-run | --yes)",
		Annotations: map[string]string{annotationWrites: "with --yes: deletes the rows of one owner lease generation and releases their capacity"},
		Short:       "Delete every row held by one owner lease generation and release its capacity",
		Long: `Delete every row (active or reserved) held by OWNER at --lease-generation
and release its capacity (the store's RemoveAllByOwner). This is an operator
write: it needs --yes; --dry-run lists the rows it would remove. An owner whose
lease is still live is refused unless --force is given.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("lease-generation") {
				return usageError(errors.New("--lease-generation is required (1..9223372036854775807)"))
			}
			if err := intRange("--lease-generation", gen, 1, math.MaxInt64); err != nil {
				return err
			}
			if yes == dryRun {
				return usageError(errors.New("remove-owner writes: pass exactly one of --yes or --dry-run"))
			}
			owner := authority.OwnerToken{OwnerID: args[0], LeaseGeneration: gen}
			if err := authority.ValidateOwner(owner); err != nil {
				return usageError(err)
			}
			return g.withStore(cmd, yes, func(ctx context.Context, s *etcdstore.Store, c *clientv3.Client) error {
				lr, err := c.Get(ctx, schema.OwnerLivenessPrefix(g.namespace, owner), clientv3.WithPrefix(), clientv3.WithCountOnly())
				if err != nil {
					return err
				}
				if lr.Count > 0 && !force && !dryRun {
					return fmt.Errorf("owner %s lease generation %d is still live; refusing without --force", owner.OwnerID, gen)
				}
				out := removalView{OwnerID: owner.OwnerID, LeaseGeneration: gen, DryRun: dryRun}
				if dryRun {
					rows, err := ownerRows(ctx, g, c, s.ReadAuthority, owner)
					if err != nil {
						return err
					}
					out.Rows = &rows
					g.foundNothing = len(rows) == 0
					t := addRows(rowTable(), rows, (*table).addRow)
					if g.output == outputTable || g.output == outputWide {
						fmt.Fprintf(g.stdout, "would remove %d rows of %s/%d:\n", len(rows), owner.OwnerID, gen)
					}
					if lr.Count > 0 {
						fmt.Fprintf(g.stderr, "warning: owner %s lease generation %d is live; --yes would also need --force\n", owner.OwnerID, gen)
					}
					return render(g.stdout, g.output, out, t)
				}
				n, err := s.RemoveAllByOwner(ctx, owner)
				out.Removed = &n
				if err != nil {
					return fmt.Errorf("removed %d rows, then: %w", n, err)
				}
				t := &table{header: []string{"OWNER", "LEASE-GEN", "REMOVED"}}
				t.add(owner.OwnerID, strconv.FormatInt(gen, 10), strconv.FormatInt(n, 10))
				return render(g.stdout, g.output, out, t)
			})
		},
	}
	cmd.Flags().Int64Var(&gen, "lease-generation", 0, "the owner's lease generation whose rows to remove")
	cmd.Flags().BoolVar(&yes, "yes", false, "really delete the rows")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only list the rows that would be removed")
	cmd.Flags().BoolVar(&force, "force", false, "remove even though the owner's lease is live")
	return cmd
}

// ownerRows reads the rows of owner through the provider's owner index (of
// either layout: ownerIndexQueries).
func ownerRows(ctx context.Context, g *globals, c *clientv3.Client,
	read func(context.Context, authority.Key) (authority.ReadResult, error), owner authority.OwnerToken) ([]rowView, error) {
	qs, err := ownerIndexQueries(ctx, c, g.namespace, owner, 0)
	if err != nil {
		return nil, err
	}
	rows := []rowView{}
	for _, q := range qs {
		part, err := listEntries(ctx, c, g.namespace, q, func(le listedEntry) (rowView, bool, error) {
			r, err := read(ctx, le.entry.Key)
			if err != nil {
				return rowView{}, false, err
			}
			if r.Kind != authority.KindSnapshot || r.Snapshot.Owner() != owner {
				return rowView{}, false, nil
			}
			return viewRow(le.entry.Key, r.Snapshot), true, nil
		})
		if err != nil {
			return nil, err
		}
		rows = append(rows, part...)
	}
	return rows, nil
}
