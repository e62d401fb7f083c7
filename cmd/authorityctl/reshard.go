package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded/reshard"
)

// clustersFile is the --clusters file of the shards commands: the clusters
// of the shard map in force, in its order, and the cluster to add.
type clustersFile struct {
	Shards []clusterEntry `yaml:"shards"`
	Add    *clusterEntry  `yaml:"add"`
}

// clusterEntry is one cluster: its endpoints and namespace, and its TLS
// files and credentials (each defaults to the global flag's).
type clusterEntry struct {
	Endpoints   []string `yaml:"endpoints"`
	Namespace   string   `yaml:"namespace"`
	CACert      string   `yaml:"cacert"`
	Cert        string   `yaml:"cert"`
	Key         string   `yaml:"key"`
	User        string   `yaml:"user"`
	PasswordEnv string   `yaml:"passwordEnv"`
}

// clustersExample is the --clusters file format, shown in --help.
const clustersExample = `# the clusters of the shard map in force, in its order
shards:
  - endpoints: [etcd-a1:2379, etcd-a2:2379, etcd-a3:2379]
    namespace: /zlink/authority/v1/
# the cluster to add (a new cluster, or an empty namespace of one)
add:
  endpoints: [etcd-b1:2379, etcd-b2:2379, etcd-b3:2379]
  namespace: /zlink/authority/v1/
  cacert: /etc/zlink/etcd-b-ca.pem   # TLS files and user default to the global flags
  user: zlink
  passwordEnv: ZLINK_ETCD_B_PASSWORD # the environment variable holding the password`

// readClusters reads and checks the --clusters file.
func (g *globals) readClusters(path string) (reshard.Config, error) {
	if path == "" {
		return reshard.Config{}, usageError(errors.New("--clusters is required: a file naming the shards of the map in force and the cluster to add"))
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return reshard.Config{}, usageError(fmt.Errorf("--clusters: %w", err))
	}
	var f clustersFile
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return reshard.Config{}, usageError(fmt.Errorf("--clusters %s: %w", path, err))
	}
	if len(f.Shards) == 0 || f.Add == nil {
		return reshard.Config{}, usageError(fmt.Errorf("--clusters %s: needs shards (the map in force, in order) and add (the cluster to add)", path))
	}
	cfg := reshard.Config{Shards: make([]etcdstore.Config, len(f.Shards))}
	for i, e := range f.Shards {
		if cfg.Shards[i], err = g.clusterConfig(e); err != nil {
			return reshard.Config{}, usageError(fmt.Errorf("--clusters %s: shard %d: %w", path, i, err))
		}
	}
	if cfg.Add, err = g.clusterConfig(*f.Add); err != nil {
		return reshard.Config{}, usageError(fmt.Errorf("--clusters %s: add: %w", path, err))
	}
	return cfg, nil
}

// clusterConfig is the etcd configuration of one entry.
func (g *globals) clusterConfig(e clusterEntry) (etcdstore.Config, error) {
	if len(e.Endpoints) == 0 {
		return etcdstore.Config{}, errors.New("no endpoints")
	}
	user, password := g.credentials()
	c := etcdstore.Config{Endpoints: e.Endpoints, Namespace: e.Namespace, CAFile: e.CACert, CertFile: e.Cert, KeyFile: e.Key,
		Username: e.User, DialTimeout: g.dialTimeout, Role: "authorityctl"}
	if c.Namespace == "" {
		c.Namespace = g.namespace
	}
	if err := schema.ValidateNamespace(c.Namespace); err != nil {
		return etcdstore.Config{}, err
	}
	if c.CAFile == "" && c.CertFile == "" {
		c.CAFile, c.CertFile, c.KeyFile = g.cacert, g.cert, g.key
	}
	switch {
	case e.User == "":
		c.Username, c.Password = user, password
	case e.PasswordEnv != "" && g.env != nil:
		c.Password = g.env(e.PasswordEnv)
	}
	return c, nil
}

// shardsView is the progress of a resharding, as the shards commands print
// it.
type shardsView struct {
	Job        string    `json:"job"`
	Phase      string    `json:"phase"`
	Step       string    `json:"step,omitempty"`
	FromEpoch  int64     `json:"fromEpoch"`
	ToEpoch    int64     `json:"toEpoch"`
	FromShards int       `json:"fromShards"`
	ToShards   int       `json:"toShards"`
	Rows       int64     `json:"rowsCopied"`
	Keys       int64     `json:"keysCopied"`
	Estimate   int64     `json:"rowsEstimate,omitempty"`
	Rate       float64   `json:"rowsPerSecond,omitempty"`
	Lag        int64     `json:"lagRevisions"`
	Raised     int64     `json:"revisionsRaised,omitempty"`
	Paused     bool      `json:"paused"`
	Decision   string    `json:"decision,omitempty"`
	Note       string    `json:"note,omitempty"`
	Started    time.Time `json:"started"`
	Updated    time.Time `json:"updated"`
	Switched   time.Time `json:"switched,omitzero"`
}

func viewOf(p reshard.Progress) shardsView {
	return shardsView{Job: p.Job, Phase: p.Phase, Step: p.Step, FromEpoch: p.FromEpoch, ToEpoch: p.ToEpoch, FromShards: p.FromShards,
		ToShards: p.ToShards, Rows: p.Rows, Keys: p.Keys, Estimate: p.Estimate, Rate: p.Rate, Lag: p.Lag, Raised: p.Raised,
		Paused: p.Paused, Decision: p.Decision, Note: p.Note, Started: p.Started, Updated: p.Updated, Switched: p.Switched}
}

func (g *globals) renderShards(p reshard.Progress) error {
	v := viewOf(p)
	t := &table{header: []string{"JOB", "PHASE", "EPOCH", "SHARDS", "ROWS", "LAG", "STEP"}, wide: []string{"KEYS", "RAISED", "DECISION", "NOTE"}}
	step := v.Step
	if v.Paused {
		step = "paused; " + step
	}
	t.add(v.Job, v.Phase, fmt.Sprintf("%d→%d", v.FromEpoch, v.ToEpoch), fmt.Sprintf("%d→%d", v.FromShards, v.ToShards),
		strconv.FormatInt(v.Rows, 10), strconv.FormatInt(v.Lag, 10), step,
		strconv.FormatInt(v.Keys, 10), strconv.FormatInt(v.Raised, 10), v.Decision, v.Note)
	return render(g.stdout, g.output, v, t)
}

func newShardsCommand(g *globals) *cobra.Command {
	var clusters string
	cmd := &cobra.Command{
		Use:   "shards",
		Short: "Grow a sharded namespace by one cluster while it runs (resharding)",
		Long: `A resharding adds one etcd cluster to the shard map of a running namespace:
it copies the rows that move to the new cluster, follows their changes, then
switches every cluster to the next map in a short fenced step, while every node
keeps writing (see docs/operations.md, "Adding a cluster"). Its progress is
stored in the new cluster: killed at any step, "shards resume" (or "shards
add" again) goes on from there; "shards abort" before the switch leaves the map
in force with nothing lost.

--clusters names the clusters, in YAML (or JSON):

` + clustersExample,
	}
	cmd.PersistentFlags().StringVar(&clusters, "clusters", "", "file naming the shards of the map in force and the cluster to add")
	cmd.AddCommand(newShardsAddCommand(g, &clusters), newShardsStatusCommand(g, &clusters),
		newShardsControlCommand(g, &clusters, "pause", "ask the job to stop at its next step (its progress stays)", reshard.Pause),
		newShardsControlCommand(g, &clusters, "resume", "run a paused or stopped job on to its end", reshard.Resume),
		newShardsControlCommand(g, &clusters, "abort", "undo the move before its switch: the map in force stays, the copies are deleted", reshard.Abort))
	return cmd
}

func newShardsAddCommand(g *globals, clusters *string) *cobra.Command {
	var yes bool
	var lag int64
	cmd := &cobra.Command{
		Use:         "add --clusters FILE --yes [--switch-lag N]",
		Annotations: map[string]string{annotationWrites: "with --yes: adds a cluster to the shard map, moving rows into it"},
		Short:       "Add the cluster of --clusters to the shard map, moving its rows (or resume that move)",
		Long: `Start the move that adds the cluster "add" of --clusters to the map of its
"shards", or resume the one the cluster holds, and run it to its end (a
progress bar on stderr). It is not bounded by --command-timeout; Ctrl-C stops
it (exit 130), and running it again resumes. --switch-lag is how close (in
revisions behind the sources) the copy must be before the switch freezes the
rows that move.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !yes {
				return usageError(errors.New("shards add writes: pass --yes"))
			}
			cfg, err := g.readClusters(*clusters)
			if err != nil {
				return err
			}
			cfg.SwitchLag = lag
			return g.runJob(cmd.Context(), cfg, reshard.Run)
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "run the move")
	cmd.Flags().Int64Var(&lag, "switch-lag", 2000, "switch once the copy lags its sources by at most this many revisions")
	return cmd
}

// runJob runs a job (add, resume) with its progress on stderr.
func (g *globals) runJob(ctx context.Context, cfg reshard.Config, run func(context.Context, reshard.Config) (reshard.Progress, error)) error {
	bar := newJobBar(g)
	cfg.Progress = bar.update
	p, err := run(ctx, cfg)
	bar.finish()
	if err != nil && ctx.Err() != nil {
		return err
	}
	if p.Job != "" {
		if rerr := g.renderShards(p); rerr != nil && err == nil {
			err = rerr
		}
	}
	return err
}

func newShardsStatusCommand(g *globals, clusters *string) *cobra.Command {
	return &cobra.Command{
		Use:   "status --clusters FILE",
		Short: "Show a resharding's phase, step, rows moved and lag",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := g.readClusters(*clusters)
			if err != nil {
				return err
			}
			ctx, cancel := g.commandContext(cmd.Context())
			defer cancel()
			p, err := reshard.Status(ctx, cfg)
			var none *reshard.NoJobError
			if errors.As(err, &none) && none.Empty {
				fmt.Fprintf(g.stderr, "warning: namespace %s holds no keys at all: check the add cluster of --clusters (this command wrote nothing)\n", none.Namespace)
			}
			if err != nil {
				return err
			}
			return g.renderShards(p)
		},
	}
}

func newShardsControlCommand(g *globals, clusters *string, name, what string, do func(context.Context, reshard.Config) (reshard.Progress, error)) *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:         name + " --clusters FILE --yes",
		Annotations: map[string]string{annotationWrites: "with --yes: " + what},
		Short:       "Resharding: " + what,
		Args:        exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !yes {
				return usageError(fmt.Errorf("shards %s writes: pass --yes", name))
			}
			cfg, err := g.readClusters(*clusters)
			if err != nil {
				return err
			}
			if name == "pause" {
				ctx, cancel := g.commandContext(cmd.Context())
				defer cancel()
				p, err := do(ctx, cfg)
				if err != nil {
					return err
				}
				return g.renderShards(p)
			}
			return g.runJob(cmd.Context(), cfg, do)
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "do it")
	return cmd
}

// jobBar shows a job's progress on stderr: a bar of the rows moved on a
// terminal, a line a few seconds otherwise.
type jobBar struct {
	g    *globals
	bar  *progressbar.ProgressBar
	last time.Time
	step string
}

func newJobBar(g *globals) *jobBar {
	b := &jobBar{g: g}
	if isTerminal(g.stderr) {
		b.bar = progressbar.NewOptions64(-1, progressbar.OptionSetWriter(g.stderr), progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(200*time.Millisecond), progressbar.OptionShowCount(), progressbar.OptionClearOnFinish())
	}
	return b
}

func (b *jobBar) update(p reshard.Progress) {
	desc := fmt.Sprintf("%s %.0f rows/s lag %d: %s", p.Phase, p.Rate, p.Lag, p.Step)
	if b.bar != nil {
		if p.Estimate > 0 && b.bar.GetMax64() != max(p.Estimate, p.Rows) {
			b.bar.ChangeMax64(max(p.Estimate, p.Rows))
		}
		b.bar.Describe(desc)
		_ = b.bar.Set64(p.Rows)
		return
	}
	if p.Step != b.step || time.Since(b.last) > 5*time.Second {
		b.step, b.last = p.Step, time.Now()
		fmt.Fprintf(b.g.stderr, "shards: %d rows moved, %s\n", p.Rows, desc)
	}
}

func (b *jobBar) finish() {
	if b.bar != nil {
		_ = b.bar.Finish()
	}
}
