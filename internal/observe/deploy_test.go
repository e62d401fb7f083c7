package observe

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	authority "github.com/zlink-systems/authority"
)

const (
	rulesFile     = "../../deploy/prometheus/alerts.yml"
	dashboardFile = "../../deploy/grafana/authority-store.json"
)

// describing is a Registerer that keeps every descriptor registered on it.
type describing struct{ names map[string]bool }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d *describing) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		d.names[fqName.FindStringSubmatch(desc.String())[1]] = true
	}
	return nil
}
func (d *describing) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}
func (d *describing) Unregister(prometheus.Collector) bool { return false }

func registeredNames(t *testing.T) map[string]bool {
	d := &describing{names: map[string]bool{}}
	require.NotNil(t, New(Config{Registerer: d}).Metrics())
	require.Greater(t, len(d.names), 20, "the stores register their metrics")
	return d.names
}

// metricRef finds metric names in PromQL; histogram and summary series
// name their family with a suffix.
var metricRef = regexp.MustCompile(`\bauthority_[a-z_]+`)

func family(series string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(series, suffix); ok {
			return base
		}
	}
	return series
}

func ruleExprs(t *testing.T) []string {
	raw, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	var doc struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	var out []string
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			out = append(out, r.Expr)
		}
	}
	require.NotEmpty(t, out)
	return out
}

func dashboardExprs(t *testing.T) []string {
	raw, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var doc struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	var out []string
	for _, p := range doc.Panels {
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	require.NotEmpty(t, out)
	return out
}

// TestDeployUsesRegisteredMetrics: every metric the alerting rules and the
// dashboard query is one the stores register, and every registered metric
// is shown on the dashboard.
func TestDeployUsesRegisteredMetrics(t *testing.T) {
	names := registeredNames(t)
	shown := map[string]bool{}
	for what, exprs := range map[string][]string{"rules": ruleExprs(t), "dashboard": dashboardExprs(t)} {
		for _, e := range exprs {
			refs := metricRef.FindAllString(e, -1)
			require.NotEmpty(t, refs, "%s: %s names no store metric", what, e)
			for _, ref := range refs {
				require.True(t, names[family(ref)], "%s uses %s, which no store registers", what, ref)
				if what == "dashboard" {
					shown[family(ref)] = true
				}
			}
		}
	}
	var missing []string
	for n := range names {
		if !shown[n] {
			missing = append(missing, n)
		}
	}
	sort.Strings(missing)
	require.Empty(t, missing, "registered but not on the dashboard")
}

func promtool(t *testing.T) string {
	path, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("AUTHORITY_REQUIRE_PROMTOOL") != "" {
			t.Fatalf("promtool is required (AUTHORITY_REQUIRE_PROMTOOL is set): %v", err)
		}
		t.Skip("promtool not installed (Debian package prometheus)")
	}
	return path
}

func TestPromtoolCheckRules(t *testing.T) {
	out, err := exec.CommandContext(t.Context(), promtool(t), "check", "rules", rulesFile).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "SUCCESS")
}

// TestPromtoolCheckMetrics records a sample in every metric and lints the
// exposition with promtool.
func TestPromtoolCheckMetrics(t *testing.T) {
	path := promtool(t)
	reg := prometheus.NewPedanticRegistry()
	o := New(Config{Registerer: reg})
	exerciseAll(t, o)
	families, err := reg.Gather()
	require.NoError(t, err)
	var text bytes.Buffer
	enc := expfmt.NewEncoder(&text, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range families {
		require.NoError(t, enc.Encode(mf))
	}
	require.Len(t, families, len(registeredNames(t)), "every metric has a sample")
	cmd := exec.CommandContext(t.Context(), path, "check", "metrics")
	cmd.Stdin = &text
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool check metrics:\n%s", out)
}

// exerciseAll records one observation in every metric o has.
func exerciseAll(t *testing.T, o *Observer) {
	ctx, op := o.Start(t.Context(), OpReserve)
	o.Refused(ctx, CompareCapacityEpoch)
	op.End(authority.KindPlacementCapacityExhausted, nil)
	_, op = o.Start(t.Context(), OpCommit)
	op.End("", errors.Join(authority.ErrUnavailable))
	m := o.Metrics()
	m.TxnSent(3, 200, true, nil, false)
	m.TxnSent(3, 200, false, errors.New("lost"), true)
	m.BatchedWrites(4)
	m.GroupCommit(2)
	m.Retry(OpCompareExchange)
	m.RowCache(true)
	m.RelocationBytes(10, true)
	m.UsageWatchStarted()
	m.UsageResync()
	m.UsageLag(3)
	m.CompactionSeen()
	m.NoSpace()
	m.LeaseDeadline(1, time.Now().Add(time.Second))
	m.KeepAliveFailed()
	m.LeaseEnded(1, true)
}
