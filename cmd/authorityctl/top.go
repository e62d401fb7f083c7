package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/cobra"
)

// maxScrapeBytes bounds one /metrics response top reads.
const maxScrapeBytes = 16 << 20

func newTopCommand(g *globals) *cobra.Command {
	var interval time.Duration
	var once bool
	cmd := &cobra.Command{
		Use:   "top [URL]",
		Short: "Operation rates by outcome from a store's /metrics endpoint, refreshing",
		Long: `top scrapes a process's /metrics endpoint (a store configured with a Registerer, or
authorityctl demo --serve --metrics-addr) every --interval and shows, per operation and outcome,
the rate over the last interval and the total, then the etcd Txn results, the failed compares by
kind and the owner leases held. URL defaults to http://127.0.0.1:9464/metrics. --once prints one
interval and exits (with -o json: one document).`,
		Args: maxArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			target := "http://127.0.0.1:9464/metrics"
			if len(args) == 1 {
				target = args[0]
			}
			if err := checkScrapeURL(target); err != nil {
				return usageError(err)
			}
			if interval < 100*time.Millisecond || interval > time.Hour {
				return usageError(fmt.Errorf("--interval %s is out of range 100ms..1h", interval))
			}
			return runTop(cmd.Context(), g, target, interval, once)
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "time between scrapes (100ms..1h)")
	cmd.Flags().BoolVar(&once, "once", false, "print one interval and exit")
	return cmd
}

// errScrapeURL reports a /metrics URL top cannot use.
var errScrapeURL = errors.New("not an http(s) URL")

// errNoAuthorityMetrics is top's failure on a /metrics endpoint that serves
// no authority_ metric: not the endpoint of a store.
var errNoAuthorityMetrics = errors.New("serves no authority_ metrics: not the /metrics of a store with a Registerer (etcdstore.Config.Registerer)")

func checkScrapeURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("metrics URL %q: %w", raw, errScrapeURL)
	}
	return nil
}

func runTop(ctx context.Context, g *globals, target string, interval time.Duration, once bool) error {
	client := &http.Client{Timeout: g.dialTimeout + interval}
	prev, err := scrape(ctx, client, target)
	if errors.Is(err, errNoAuthorityMetrics) {
		return err
	}
	if err != nil {
		return connectError(err)
	}
	terminal := isTerminal(g.stdout)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
		cur, err := scrape(ctx, client, target)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return connectError(err)
		}
		view := topViewOf(prev, cur, interval)
		if terminal && !once && g.output != outputJSON && g.output != outputYAML {
			fmt.Fprint(g.stdout, "\x1b[H\x1b[2J") // clear the screen, like top
		}
		if err := render(g.stdout, g.output, view, view.table()); err != nil {
			return err
		}
		if once {
			return nil
		}
		prev = cur
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// sample is one scrape: counter and gauge values by series.
type sample map[seriesKey]float64

type seriesKey struct{ name, a, b string }

func scrape(ctx context.Context, client *http.Client, target string) (sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", target, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: HTTP %s", target, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(io.LimitReader(resp.Body, maxScrapeBytes))
	if err != nil {
		return nil, fmt.Errorf("scrape %s: not Prometheus text: %w", target, err)
	}
	if !slices.ContainsFunc(slices.Collect(maps.Keys(families)), func(n string) bool { return strings.HasPrefix(n, "authority_") }) {
		return nil, fmt.Errorf("%s %w", target, errNoAuthorityMetrics)
	}
	s := sample{}
	for name, labels := range topSeries {
		for _, m := range families[name].GetMetric() {
			k := seriesKey{name: name}
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case labels[0]:
					k.a = l.GetValue()
				case labels[1]:
					k.b = l.GetValue()
				}
			}
			switch {
			case m.GetCounter() != nil:
				s[k] += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				s[k] += m.GetGauge().GetValue()
			}
		}
	}
	return s, nil
}

// topSeries are the metrics top reads, with the (up to two) labels it keeps.
var topSeries = map[string][2]string{
	"authority_operations_total":                  {"operation", "outcome"},
	"authority_etcd_txns_total":                   {"result", ""},
	"authority_failed_compares_total":             {"compare", ""},
	"authority_owner_leases_held":                 {"", ""},
	"authority_owner_lease_min_remaining_seconds": {"", ""},
}

// topView is one refresh of top.
type topView struct {
	IntervalSeconds float64   `json:"intervalSeconds" yaml:"intervalSeconds"`
	Operations      []topRate `json:"operations" yaml:"operations"`
	Txns            []topRate `json:"txns" yaml:"txns"`
	FailedCompares  []topRate `json:"failedCompares" yaml:"failedCompares"`
	OwnerLeasesHeld float64   `json:"ownerLeasesHeld" yaml:"ownerLeasesHeld"`
	LeastLeaseLeft  *float64  `json:"leastLeaseLeftSeconds,omitempty" yaml:"leastLeaseLeftSeconds,omitempty"`
}

// topRate is one series: its rate over the interval and its total.
type topRate struct {
	Operation     string  `json:"operation,omitempty" yaml:"operation,omitempty"`
	Outcome       string  `json:"outcome,omitempty" yaml:"outcome,omitempty"`
	Kind          string  `json:"kind,omitempty" yaml:"kind,omitempty"`
	RatePerSecond float64 `json:"ratePerSecond" yaml:"ratePerSecond"`
	Total         float64 `json:"total" yaml:"total"`
}

func topViewOf(prev, cur sample, interval time.Duration) topView {
	v := topView{IntervalSeconds: interval.Seconds()}
	for k, total := range cur {
		rate := max(total-prev[k], 0) / interval.Seconds()
		switch k.name {
		case "authority_operations_total":
			v.Operations = append(v.Operations, topRate{Operation: k.a, Outcome: k.b, RatePerSecond: rate, Total: total})
		case "authority_etcd_txns_total":
			v.Txns = append(v.Txns, topRate{Kind: k.a, RatePerSecond: rate, Total: total})
		case "authority_failed_compares_total":
			v.FailedCompares = append(v.FailedCompares, topRate{Kind: k.a, RatePerSecond: rate, Total: total})
		case "authority_owner_leases_held":
			v.OwnerLeasesHeld = total
		case "authority_owner_lease_min_remaining_seconds":
			if total < 1e300 {
				left := total
				v.LeastLeaseLeft = &left
			}
		}
	}
	for _, rs := range [][]topRate{v.Operations, v.Txns, v.FailedCompares} {
		sort.Slice(rs, func(i, j int) bool {
			if rs[i].RatePerSecond != rs[j].RatePerSecond {
				return rs[i].RatePerSecond > rs[j].RatePerSecond
			}
			return rs[i].Operation+rs[i].Outcome+rs[i].Kind < rs[j].Operation+rs[j].Outcome+rs[j].Kind
		})
	}
	return v
}

func (v topView) table() *table {
	ops := &table{header: []string{"OPERATION", "OUTCOME", "RATE/S", "TOTAL"}}
	for _, r := range v.Operations {
		ops.add(r.Operation, r.Outcome, rate(r.RatePerSecond), count(r.Total))
	}
	other := &table{header: []string{"WHAT", "KIND", "RATE/S", "TOTAL"}, before: ops}
	for _, r := range v.Txns {
		other.add("etcd txns", r.Kind, rate(r.RatePerSecond), count(r.Total))
	}
	for _, r := range v.FailedCompares {
		other.add("failed compare", r.Kind, rate(r.RatePerSecond), count(r.Total))
	}
	left := "-"
	if v.LeastLeaseLeft != nil {
		left = (time.Duration(*v.LeastLeaseLeft * float64(time.Second))).Round(100 * time.Millisecond).String()
	}
	other.add("owner leases held", "least time left "+left, "", count(v.OwnerLeasesHeld))
	return other
}

func rate(r float64) string  { return strconv.FormatFloat(r, 'f', 1, 64) }
func count(n float64) string { return strconv.FormatFloat(n, 'f', 0, 64) }
