package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// errNotFound reports a row that does not exist.
var errNotFound = errors.New("not found")

func newGetCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "get KIND ID | get KIND/ID",
		Short: "Show one authority row (KIND: actor, user_spot, instance_spot; KIND/ID as list prints keys)",
		Args:  rangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, id, key, err := rowKeyOf(args)
			if err != nil {
				return err
			}
			get := func(ctx context.Context, s authority.AuthorityStore) error {
				r, err := s.ReadAuthority(ctx, key)
				if err != nil {
					return err
				}
				if r.Kind != authority.KindSnapshot {
					g.foundNothing = true
					return fmt.Errorf("%s %q: %w", kind, id, errNotFound)
				}
				v := viewRow(key, r.Snapshot)
				return render(g.stdout, g.output, v, addRows(rowTable(), []rowView{v}, (*table).addRow))
			}
			if g.shards != nil {
				return g.withShardedStore(cmd, func(ctx context.Context, s *sharded.Store) error { return get(ctx, s) })
			}
			return g.withStore(cmd, false, func(ctx context.Context, s *etcdstore.Store, _ *clientv3.Client) error {
				return get(ctx, s)
			})
		},
	}
}

// rowKeyOf resolves get's arguments: KIND ID, or one key KIND/ID as list
// prints it (its ID path-escaped as in the store's keys).
func rowKeyOf(args []string) (authority.ObjectKind, string, authority.Key, error) {
	kindArg, id := "", ""
	if len(args) == 2 {
		kindArg, id = args[0], args[1]
	} else {
		if ok, err := authority.DecodeKey(authority.Key(args[0])); err == nil {
			return ok.Kind, ok.GlobalID, authority.Key(args[0]), nil
		}
		var found bool
		if kindArg, id, found = strings.Cut(args[0], "/"); !found {
			return "", "", "", usageError(fmt.Errorf("get takes KIND ID or KIND/ID (as list prints keys), got %q", args[0]))
		}
	}
	kind, err := parseKind(kindArg)
	if err != nil {
		return "", "", "", err
	}
	key, err := authority.EncodeKey(kind, id)
	if err != nil {
		return "", "", "", usageError(err)
	}
	return kind, id, key, nil
}

// listRows prints the rows under prefix, read from l; with a client of its
// single cluster (c), a listing that stops at an undecodable row lists every
// decodable one, naming the others.
func listRows(ctx context.Context, g *globals, l authority.AuthorityStore, c *clientv3.Client, prefix string, limit int, all bool) error {
	out := listView{Items: []rowView{}}
	var cursor authority.ScanCursor
	for {
		page, err := l.ListAuthorities(ctx, prefix, cursor, limit)
		if errors.Is(err, authority.ErrCorrupt) && c != nil {
			// the store's listing stops at a row it cannot
			// decode: list every decodable one, naming the others
			if out, err = listDecodable(ctx, g, c, prefix, limit, all); err != nil {
				return err
			}
			break
		}
		if err != nil {
			return err
		}
		if page.Kind == authority.KindScanExpired {
			return errors.New("the listing expired (etcd compacted its revision); run list again")
		}
		for _, it := range page.Items {
			out.Items = append(out.Items, viewRow(it.Key, it.Snapshot))
		}
		cursor = page.NextCursor
		if cursor == "" {
			break
		}
		if !all {
			out.More = true
			fmt.Fprintf(g.stderr, "more rows follow; use --all to list them all\n")
			break
		}
	}
	g.foundNothing = len(out.Items) == 0
	return render(g.stdout, g.output, out, addRows(rowTable(), out.Items, (*table).addRow))
}

// listView is the JSON/YAML form of list.
type listView struct {
	Items []rowView `json:"items"`
	// More is true when --all was not given and more rows follow.
	More bool `json:"more"`
}

func newListCommand(g *globals) *cobra.Command {
	var limit int
	var all bool
	cmd := &cobra.Command{
		Use:   "list [PREFIX]",
		Short: "List authority rows whose key starts with PREFIX (e.g. user_spot/)",
		Long: `List authority rows in key order, through the store's paged, consistent
listing. Without --all only the first page (--limit rows) is shown.`,
		Args: maxArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := authority.ValidateScanLimit(limit); err != nil {
				return intRange("--limit", int64(limit), 1, authority.MaxScanLimit)
			}
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			if err := authority.ValidateScanPrefix(prefix); err != nil {
				return usageError(fmt.Errorf("PREFIX %q: %w", prefix, err))
			}
			if g.shards != nil {
				return g.withShardedStore(cmd, func(ctx context.Context, s *sharded.Store) error {
					return listRows(ctx, g, s, nil, prefix, limit, all)
				})
			}
			return g.withStore(cmd, false, func(ctx context.Context, s *etcdstore.Store, c *clientv3.Client) error {
				return listRows(ctx, g, s, c, prefix, limit, all)
			})
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 500, fmt.Sprintf("rows per page (1..%d)", authority.MaxScanLimit))
	cmd.Flags().BoolVar(&all, "all", false, "page through every row")
	return cmd
}

// listDecodable lists the rows under prefix at one revision (the first
// limit unless all), leaving out and naming on stderr each key that does not
// decode.
func listDecodable(ctx context.Context, g *globals, c *clientv3.Client, prefix string, limit int, all bool) (listView, error) {
	q := entryQuery{prefix: schema.Prefix(g.namespace, schema.EntryRow) + prefix, undecodable: g.skipUndecodable}
	rows, err := listEntries(ctx, c, g.namespace, q, func(le listedEntry) (rowView, bool, error) {
		return viewRow(le.entry.Key, le.entry.Snapshot), true, nil
	})
	if err != nil {
		return listView{}, err
	}
	out := listView{Items: rows}
	if !all && len(rows) > limit {
		out.Items, out.More = rows[:limit], true
		fmt.Fprintf(g.stderr, "more rows follow; use --all to list them all\n")
	}
	return out, nil
}

// eventView is one watched row change.
type eventView struct {
	Revision int64    `json:"revision"`
	Type     string   `json:"type"`
	Key      string   `json:"key"`
	Row      *rowView `json:"row,omitempty"`
}

func newWatchCommand(g *globals) *cobra.Command {
	var rev int64
	var count int
	cmd := &cobra.Command{
		Use:   "watch [PREFIX]",
		Short: "Stream changes of authority rows whose key starts with PREFIX",
		Long: `Stream row changes (created, updated, removed) as they happen, from the
store's typed row feed, from --rev when given (replaying history still held
by etcd). One line (table), one JSON object per line (json) or one YAML
document (yaml) per change. A row that does not decode is shown without its
content and named on stderr. Stops on Ctrl-C or after --count changes.`,
		Args: maxArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := intRange("--rev", rev, 0, math.MaxInt64); err != nil {
				return err
			}
			if err := intRange("--count", int64(count), 0, maxWatchCount); err != nil {
				return err
			}
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			return runWatch(cmd.Context(), g, prefix, rev, count)
		},
	}
	cmd.Flags().Int64Var(&rev, "rev", 0, "start from this revision (0: from now; 1: the whole history etcd still holds)")
	cmd.Flags().IntVar(&count, "count", 0, fmt.Sprintf("stop after this many changes (0: never; up to %d)", maxWatchCount))
	return cmd
}

func writeEvent(g *globals, v eventView) error {
	switch g.output {
	case outputJSON:
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(g.stdout, "%s\n", b)
		return err
	case outputYAML:
		b, err := toYAML(v)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(g.stdout, "---\n%s", b)
		return err
	}
	detail := "-"
	if v.Row != nil {
		detail = fmt.Sprintf("%s owner=%s/%d token=%d node=%s/%s@%d version=%s payload=%s", v.Row.State, v.Row.OwnerID,
			v.Row.OwnerLeaseGeneration, v.Row.OwnershipToken, v.Row.MeshName, v.Row.NodeRID, v.Row.NodeLifecycleGeneration,
			v.Row.StoreVersion, v.Row.Payload.String())
	}
	_, err := fmt.Fprintf(g.stdout, "%-8s %-7s %-40s %s\n", strconv.FormatInt(v.Revision, 10), v.Type, v.Key, detail)
	return err
}
