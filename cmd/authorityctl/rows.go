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
	clientv3 "go.etcd.io/etcd/client/v3"
)

// errNotFound reports a row that does not exist.
var errNotFound = errors.New("not found")

func newGetCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "get KIND ID",
		Short: "Show one authority row (KIND: actor, user_spot, instance_spot)",
		Args:  exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, err := parseKind(args[0])
			if err != nil {
				return err
			}
			key, err := authority.EncodeKey(kind, args[1])
			if err != nil {
				return usageError(err)
			}
			return g.withStore(cmd, func(ctx context.Context, s *etcdstore.Store, _ *clientv3.Client) error {
				r, err := s.ReadAuthority(ctx, key)
				if err != nil {
					return err
				}
				if r.Kind != authority.KindSnapshot {
					return fmt.Errorf("%s %q: %w", kind, args[1], errNotFound)
				}
				v := viewRow(key, r.Snapshot)
				return render(g.stdout, g.output, v, addRows(rowTable(), []rowView{v}, (*table).addRow))
			})
		},
	}
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
			return g.withStore(cmd, func(ctx context.Context, s *etcdstore.Store, _ *clientv3.Client) error {
				out := listView{Items: []rowView{}}
				var cursor authority.ScanCursor
				for {
					page, err := s.ListAuthorities(ctx, prefix, cursor, limit)
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
				return render(g.stdout, g.output, out, addRows(rowTable(), out.Items, (*table).addRow))
			})
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 500, fmt.Sprintf("rows per page (1..%d)", authority.MaxScanLimit))
	cmd.Flags().BoolVar(&all, "all", false, "page through every row")
	return cmd
}

// eventView is one row change of the typed feed (authority.RowFeed), or
// with --progress a progress mark (type PROGRESS, no key).
type eventView struct {
	Revision int64    `json:"revision"`
	Type     string   `json:"type"`
	Key      string   `json:"key,omitempty"`
	Row      *rowView `json:"row,omitempty"`
}

func newWatchCommand(g *globals) *cobra.Command {
	var rev int64
	var count int
	var progress bool
	cmd := &cobra.Command{
		Use:   "watch [PREFIX]",
		Short: "Stream the typed row feed of authority rows whose key starts with PREFIX",
		Long: `Stream the store's typed row feed: each row change (CREATED, UPDATED,
REMOVED) with its decoded row, in commit order, from --rev when given
(replaying history still held by etcd). With --progress also the feed's
progress marks (PROGRESS: nothing changed under PREFIX up to that revision).
One line (table), one JSON object per line (json) or one YAML document (yaml)
per change. Stops on Ctrl-C or after --count changes.`,
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
			ctx := cmd.Context()
			s, _, closeStore, err := g.store(ctx)
			if err != nil {
				return err
			}
			defer closeStore()
			req := authority.FeedRequest{Prefix: prefix}
			if rev > 0 {
				// changes from rev on; nothing changes at revision 1 (an
				// empty etcd's), so --rev 1 is After 1: the whole history
				req.After = max(rev-1, 1)
			}
			return watchFeed(ctx, g, s, req, rev, count, progress)
		},
	}
	cmd.Flags().Int64Var(&rev, "rev", 0, "start from this revision (0: from now; 1: the whole history etcd still holds)")
	cmd.Flags().IntVar(&count, "count", 0, fmt.Sprintf("stop after this many changes (0: never; up to %d)", maxWatchCount))
	cmd.Flags().BoolVar(&progress, "progress", false, "also print the feed's progress marks")
	return cmd
}

// watchFeed prints the feed req opens until ctx ends or count changes
// were printed.
func watchFeed(ctx context.Context, g *globals, s *etcdstore.Store, req authority.FeedRequest, rev int64, count int, progress bool) error {
	feed, err := s.WatchRows(ctx, req)
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	defer feed.Close()
	if g.output == outputTable || g.output == outputWide {
		fmt.Fprintf(g.stdout, "%-8s %-8s %-40s %s\n", "REV", "TYPE", "KEY", "DETAIL")
	}
	seen := 0
	for {
		b, err := feed.Next(ctx)
		switch {
		case ctx.Err() != nil:
			return nil // the user stopped it (Ctrl-C, SIGTERM): not a failure
		case errors.Is(err, authority.ErrFeedCompacted):
			return fmt.Errorf("watch: --rev %d is compacted: %w", rev, err)
		case err != nil:
			return fmt.Errorf("watch: %w", err)
		}
		if b.Kind == authority.FeedProgress && progress {
			if err := writeEvent(g, eventView{Revision: b.Revision, Type: "PROGRESS"}); err != nil {
				return err
			}
		}
		for _, ev := range b.Events {
			v := eventView{Revision: ev.Revision, Type: strings.ToUpper(string(ev.Kind)), Key: string(ev.Key)}
			if ev.Snapshot != nil {
				rv := viewRow(ev.Key, ev.Snapshot)
				v.Row = &rv
			}
			if err := writeEvent(g, v); err != nil {
				return err
			}
			if seen++; count > 0 && seen >= count {
				return nil
			}
		}
	}
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
		detail = fmt.Sprintf("%s owner=%s/%d node=%s/%s@%d version=%s payload=%s", v.Row.State, v.Row.OwnerID,
			v.Row.OwnerLeaseGeneration, v.Row.MeshName, v.Row.NodeRID, v.Row.NodeLifecycleGeneration,
			v.Row.StoreVersion, v.Row.Payload.String())
	}
	_, err := fmt.Fprintf(g.stdout, "%-8s %-8s %-40s %s\n", strconv.FormatInt(v.Revision, 10), v.Type, orDash(v.Key), detail)
	return err
}
