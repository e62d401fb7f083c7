package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// envPrefix prefixes the environment variable of every global flag
// (--dial-timeout: AUTHORITYCTL_DIAL_TIMEOUT). A flag on the command line
// wins over its variable.
const envPrefix = "AUTHORITYCTL_"

// globals are the connection and output settings every command shares.
type globals struct {
	endpoints      []string
	namespace      string
	cacert         string
	cert           string
	key            string
	user           string
	password       string
	dialTimeout    time.Duration
	commandTimeout time.Duration
	output         string
	// shardsFile is --shards; shards its clusters (nil without it).
	shardsFile string
	shards     *shardSet
	// sendLimit is the client's send limit the command needs (doctor's
	// request-size probe); at least 4 MiB.
	sendLimit int
	// skipped counts the undecodable keys a listing left out
	// (skipUndecodable).
	skipped int
	// cmdCtx is the context commandContext made (nil before).
	cmdCtx context.Context
	// foundNothing says the command read nothing (no row, no entry): it
	// then warns if the namespace holds no key at all (afterRead).
	foundNothing bool

	stdout, stderr io.Writer
	env            func(string) string
}

// rootLong is the root --help; writers is writersText's list.
func rootLong(writers string) string {
	return `authorityctl inspects and operates the etcd-backed authority store.

Commands only read: they write nothing, not even when they open the store.
These are the exceptions, with what they write:
` + writers + `

A command that reads and finds nothing says on stderr when the namespace
holds no keys at all, so that a mistyped --namespace shows; its exit code
stays its own.

Every global flag can also be set through an environment variable named
AUTHORITYCTL_<FLAG> (for example AUTHORITYCTL_ENDPOINTS, AUTHORITYCTL_PASSWORD);
a flag on the command line wins. The password is never prompted for.

Exit codes:
  0  success
  1  the command failed (a missing row, a failed doctor check, a store error)
  2  usage error (bad flag, bad argument, unknown kind or command)
  3  cannot connect (unreachable endpoint, TLS files, credentials)
  130  stopped by Ctrl-C or SIGTERM (every command)`
}

// writersText lists the commands under root that write (annotationWrites),
// one a line with what they write, in command order.
func writersText(root *cobra.Command) string {
	var lines []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if writes(c) {
			lines = append(lines, fmt.Sprintf("  %-18s %s", strings.TrimPrefix(c.CommandPath(), root.Name()+" "), c.Annotations[annotationWrites]))
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return strings.Join(lines, "\n")
}

// newRootCommand builds the command tree writing to stdout and stderr and
// reading environment variables through env.
func newRootCommand(stdout, stderr io.Writer, env func(string) string) *cobra.Command {
	root, _ := newRoot(stdout, stderr, env)
	return root
}

// newRoot builds the command tree and returns it with its globals.
func newRoot(stdout, stderr io.Writer, env func(string) string) (*cobra.Command, *globals) {
	g := &globals{stdout: stdout, stderr: stderr, env: env}
	root := &cobra.Command{
		Use:           "authorityctl",
		Version:       versionText(),
		Short:         "Inspect and operate the etcd-backed authority store",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return g.prepare(cmd)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageError(errors.New("a command is required"))
		},
		Args: cobra.NoArgs,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate("{{versionOutput .}}")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })
	pf := root.PersistentFlags()
	pf.StringSliceVar(&g.endpoints, "endpoints", []string{"127.0.0.1:2379"}, "etcd endpoints, comma separated")
	pf.StringVar(&g.namespace, "namespace", etcdstore.DefaultNamespace, "key prefix of the store (must end in \"/\")")
	pf.StringVar(&g.cacert, "cacert", "", "verify the server's certificate with this CA bundle (turns TLS on)")
	pf.StringVar(&g.cert, "cert", "", "client certificate file (TLS, with --key)")
	pf.StringVar(&g.key, "key", "", "client private key file (TLS, with --cert)")
	pf.StringVar(&g.user, "user", "", "etcd user name (\"name\" or \"name:password\")")
	pf.StringVar(&g.password, "password", "", "etcd password (prefer AUTHORITYCTL_PASSWORD)")
	pf.DurationVar(&g.dialTimeout, "dial-timeout", 5*time.Second, "how long to wait for an endpoint to answer")
	pf.DurationVar(&g.commandTimeout, "command-timeout", 30*time.Second, "bound on one command (not watch or demo)")
	pf.StringVarP(&g.output, "output", "o", outputTable, "output format: "+strings.Join(outputFormats, "|"))
	pf.StringVar(&g.shardsFile, "shards", "", "JSON file listing the etcd clusters of a sharded store (provider/sharded): list, get and doctor read every shard")

	root.AddCommand(
		newGetCommand(g), newListCommand(g), newWatchCommand(g),
		newOwnersCommand(g), newCapacityCommand(g),
		newTerminalsCommand(g), newAggregatesCommand(g), newReservationsCommand(g),
		newDoctorCommand(g), newRemoveOwnerCommand(g), newPruneEpochsCommand(g), newDemoCommand(g),
		newBlobsCommand(g), newTopCommand(g), newBenchCommand(g), newUpgradeCommand(g),
	)
	for _, c := range root.Commands() {
		c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })
	}
	root.Long = rootLong(writersText(root))
	return root, g
}

// prepare applies the AUTHORITYCTL_* variables to the global flags not set on
// the command line, then checks the flags.
func (g *globals) prepare(cmd *cobra.Command) error {
	var err error
	cmd.Root().PersistentFlags().VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || g.env == nil {
			return
		}
		name := envPrefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := g.env(name); v != "" {
			if sv, ok := f.Value.(pflag.SliceValue); ok {
				// replace the default instead of appending to it
				err = sv.Replace(strings.Split(v, ","))
			} else {
				err = f.Value.Set(v)
			}
			if err != nil {
				err = usageError(fmt.Errorf("invalid %s=%q: %v", name, v, err))
			}
		}
	})
	if err != nil {
		return err
	}
	if !slices.Contains(outputFormats, g.output) {
		return usageError(fmt.Errorf("unknown output format %q (want one of %s)", g.output, strings.Join(outputFormats, ", ")))
	}
	if err := schema.ValidateNamespace(g.namespace); err != nil {
		return usageError(fmt.Errorf("--namespace: %w", err))
	}
	if len(g.endpoints) == 0 {
		return usageError(errors.New("--endpoints is empty"))
	}
	for i, ep := range g.endpoints {
		if strings.TrimSpace(ep) == "" {
			return usageError(fmt.Errorf("--endpoints %q: element %d of %d is empty", strings.Join(g.endpoints, ","), i+1, len(g.endpoints)))
		}
	}
	if err := durationRange("--dial-timeout", g.dialTimeout, minTimeout, maxDialTimeout); err != nil {
		return err
	}
	if err := durationRange("--command-timeout", g.commandTimeout, minTimeout, maxCommandTimeout); err != nil {
		return err
	}
	if (g.cert == "") != (g.key == "") {
		return usageError(errors.New("--cert and --key must be given together"))
	}
	return g.loadShards(cmd)
}

// errCommandTimeout is the cause of a command context that ran out.
var errCommandTimeout = errors.New("--command-timeout ran out")

// commandContext bounds a short-running command by --command-timeout.
func (g *globals) commandContext(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithTimeoutCause(ctx, g.commandTimeout, errCommandTimeout)
	g.cmdCtx = cctx
	return cctx, cancel
}

// timedOut reports whether the command's --command-timeout ran out.
func (g *globals) timedOut() bool {
	return g.cmdCtx != nil && errors.Is(context.Cause(g.cmdCtx), errCommandTimeout)
}

// exactArgs is cobra.ExactArgs reporting a usage error.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := cobra.ExactArgs(n)(cmd, args); err != nil {
			return usageError(err)
		}
		return nil
	}
}

// rangeArgs is cobra.RangeArgs reporting a usage error.
func rangeArgs(lo, hi int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := cobra.RangeArgs(lo, hi)(cmd, args); err != nil {
			return usageError(err)
		}
		return nil
	}
}

// maxArgs is cobra.MaximumNArgs reporting a usage error.
func maxArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := cobra.MaximumNArgs(n)(cmd, args); err != nil {
			return usageError(err)
		}
		return nil
	}
}

// skipUndecodable names a key a listing cannot decode on stderr and leaves
// it out: the listing shows every decodable entry, and the command then
// fails (errUndecodable).
func (g *globals) skipUndecodable(err error) {
	g.skipped++
	fmt.Fprintf(g.stderr, "warning: skipped: %v\n", err)
}

// errUndecodable is the failure of a command that left undecodable keys out.
var errUndecodable = errors.New("undecodable keys were left out (named above); the other entries are shown; authorityctl doctor lists every such key")

// unknownCommand finds the name in cobra's "unknown command" error.
var unknownCommand = regexp.MustCompile(`^unknown command "([^"]*)"`)

// suggest adds the commands a mistyped one may have meant (a prefix, or a
// name within two edits: "prune" → prune-epochs) to cobra's error, which
// gives none when the root command takes no arguments.
func suggest(root *cobra.Command, err error) error {
	m := unknownCommand.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	root.SuggestionsMinimumDistance = 2
	if s := root.SuggestionsFor(m[1]); len(s) > 0 {
		return fmt.Errorf("%w; did you mean %s?", err, strings.Join(s, " or "))
	}
	return err
}

// run executes the command line args and returns the exit code, printing
// errors (and, for usage errors, a short usage line) to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, env func(string) string) int {
	root, g := newRoot(stdout, stderr, env)
	if args == nil {
		args = []string{} // cobra would read os.Args
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if ctx.Err() != nil && exitCode(err) != exitUsage {
		// stopped by the user: the same code for every command, whether it
		// was cut short or (watch, top, demo --serve) ran until stopped
		if err != nil {
			fmt.Fprintf(stderr, "Error: stopped by a signal before finishing (%v)\n", err)
		}
		return exitInterrupted
	}
	if err == nil && g.skipped > 0 {
		err = fmt.Errorf("%d %w", g.skipped, errUndecodable)
	}
	if err == nil {
		return exitOK
	}
	if strings.HasPrefix(err.Error(), "unknown command") {
		err = usageError(suggest(root, err))
	}
	code := exitCode(err)
	switch {
	case code == exitUsage:
	case g.timedOut() && !strings.Contains(err.Error(), "--command-timeout"):
		err = fmt.Errorf("%w (--command-timeout %s ran out; raise it)", err, g.commandTimeout)
	}
	fmt.Fprintf(stderr, "Error: %v\n", err)
	if code == exitUsage && cmd != nil {
		if cmd.HasParent() {
			fmt.Fprintf(stderr, "Usage: %s\nRun '%s --help' for its flags.\n", cmd.UseLine(), cmd.CommandPath())
		} else {
			fmt.Fprintf(stderr, "Usage: authorityctl [global flags] COMMAND\nRun 'authorityctl --help' for the commands.\n")
		}
	}
	return code
}

// annotationWrites marks a command that writes (cobra.Command.Annotations),
// with what it writes as its value. The root --help lists these commands,
// and a test checks that every other one writes nothing.
const annotationWrites = "authorityctl/writes"

// writes reports whether c is a command that writes.
func writes(c *cobra.Command) bool { _, ok := c.Annotations[annotationWrites]; return ok }
