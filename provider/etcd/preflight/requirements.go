package preflight

import (
	"fmt"
	"strconv"
	"strings"
)

// ServerRequirement is one etcd server flag the provider needs set, and why.
type ServerRequirement struct {
	// Flag is the etcd server flag, e.g. "--max-txn-ops".
	Flag string
	// Value is the value to set, as the flag takes it on the command line
	// ("1024", "LeaseCheckpoint=true,LeaseCheckpointPersist=true"); empty
	// for a plain boolean flag.
	Value string
	// Why says what breaks without it.
	Why string
	// Check reports whether a flag value (as given on the command line, ""
	// when absent) meets the requirement, and if not, what is wrong.
	Check func(value string) error
}

// Arg is the requirement as one command-line argument ("--max-txn-ops=1024",
// "--experimental-enable-lease-checkpoint").
func (r ServerRequirement) Arg() string {
	if r.Value == "" {
		return r.Flag
	}
	return r.Flag + "=" + r.Value
}

// DefaultMaxTxnOps is etcd's default --max-txn-ops, the least the
// --max-txn-ops requirement accepts (etcd.DefaultMaxTxnOps, Config's default,
// is this value).
const DefaultMaxTxnOps = 128

// RecommendedMaxRequestBytes is the --max-request-bytes that lets a full
// 1 MiB payload travel together with its inline creation content reference
// (a 1 MiB request encodes to about 1.4 MiB) in one reservation.
const RecommendedMaxRequestBytes = 4 * 1024 * 1024

// RecommendedMaxTxnOps is the --max-txn-ops production clusters run with:
// aggregates of up to about 200 participants in one Txn.
const RecommendedMaxTxnOps = 1024

// ServerRequirements lists the etcd server settings this provider relies on,
// for etcd 3.6 and later (lease checkpointing through --feature-gates). The
// README documents them, and a test checks docker-compose.yml against them
// so the two never drift. ServerRequirementsFor gives the flags of an older
// server. Set etcd.Config's MaxTxnOps and MaxRequestBytes to the values the
// servers run with.
var ServerRequirements = ServerRequirementsFor("3.6.0")

// ServerRequirementsFor lists the etcd server settings this provider relies
// on, spelled as the server of the given version ("3.4.23", "v3.5.21") takes
// them: only the lease-checkpoint flags differ between versions (see
// LeaseCheckpointRequirements). An unparsable version is treated as 3.6+.
func ServerRequirementsFor(version string) []ServerRequirement {
	return append([]ServerRequirement{
		{
			Flag:  "--max-txn-ops",
			Value: strconv.Itoa(RecommendedMaxTxnOps),
			Why: "an aggregate commits all participants in one Txn; a 16-participant move needs about 100 ops " +
				"(Config.MaxTxnOps must equal the server's value)",
			Check: flagAtLeast(DefaultMaxTxnOps),
		},
		{
			Flag:  "--max-request-bytes",
			Value: strconv.Itoa(RecommendedMaxRequestBytes),
			Why: "a row carries up to 1 MiB of payload plus its creation content reference; " +
				"the default 1.5 MiB refuses full-size creations (Config.MaxRequestBytes must equal the server's value)",
			Check: flagAtLeast(RecommendedMaxRequestBytes),
		},
		{
			Flag:  "--auto-compaction-retention",
			Value: "1h",
			Why:   "etcd keeps every revision of every row until something compacts; without it the database grows until NOSPACE",
			Check: nonZero,
		},
	}, LeaseCheckpointRequirements(version)...)
}

const leaseCheckpointWhy = "lease checkpointing keeps owner-lease TTLs across leader changes, " +
	"so a dead owner's liveness expires on time instead of being extended by every election"

// LeaseCheckpointRequirements returns the flags that turn lease
// checkpointing on in an etcd server of the given version. A flag a server
// does not know stops it at start ("flag provided but not defined"), so they
// differ by version (read from etcd's etcdmain/config.go of 3.5.0, 3.5.1,
// 3.5.2, 3.6.17 and 3.7.3, CHANGELOG-3.4, and run on 3.4.23):
//
//   - 3.4.0–3.4.19 and 3.5.0–3.5.1: --experimental-enable-lease-checkpoint only;
//   - 3.4.20+ and 3.5.2+: also --experimental-enable-lease-checkpoint-persist
//     (without it a leader change still resets the TTLs);
//   - 3.6 and later: --feature-gates=LeaseCheckpoint=true,LeaseCheckpointPersist=true
//     (3.6 still takes the experimental flags, deprecated; 3.7 removed them).
func LeaseCheckpointRequirements(version string) []ServerRequirement {
	checkpoint := ServerRequirement{Flag: "--experimental-enable-lease-checkpoint", Why: leaseCheckpointWhy, Check: boolFlag}
	persist := ServerRequirement{Flag: "--experimental-enable-lease-checkpoint-persist", Why: "without it a leader change " +
		"still resets the remaining TTLs (requires --experimental-enable-lease-checkpoint)", Check: boolFlag}
	v, ok := parseServerVersion(version)
	switch {
	case ok && v[0] == 3 && (v[1] < 4 || v[1] == 4 && v[2] < 20 || v[1] == 5 && v[2] < 2):
		return []ServerRequirement{checkpoint}
	case ok && v[0] == 3 && v[1] <= 5:
		return []ServerRequirement{checkpoint, persist}
	}
	return []ServerRequirement{{Flag: "--feature-gates", Value: "LeaseCheckpoint=true,LeaseCheckpointPersist=true",
		Why: leaseCheckpointWhy, Check: hasGates("LeaseCheckpoint=true", "LeaseCheckpointPersist=true")}}
}

// parseServerVersion parses "3.5.21", "v3.4.23", "3.6.0-rc.1" (a pre-release
// counts as its release).
func parseServerVersion(s string) ([3]int, bool) {
	var out [3]int
	s = strings.TrimPrefix(strings.TrimSpace(s), "v")
	parts := strings.SplitN(strings.SplitN(s, "-", 2)[0], ".", 3)
	if len(parts) < 2 {
		return out, false
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return out, false
		}
		out[i] = n
	}
	return out, true
}

// flagAtLeast checks an integer flag's value: set, and at least min.
func flagAtLeast(min int64) func(string) error {
	return func(v string) error {
		if v == "" {
			return fmt.Errorf("not set (server default is too low); need >= %d", min)
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("value %q is not an integer", v)
		}
		if n < min {
			return fmt.Errorf("value %d is below the required %d", n, min)
		}
		return nil
	}
}

func nonZero(v string) error {
	if v == "" || strings.TrimLeft(v, "0") == "" {
		return fmt.Errorf("not set: auto-compaction is off")
	}
	return nil
}

// boolFlag checks a boolean flag's value: "true" (pass "true" for a bare
// "--flag" on a command line), "" when it is absent.
func boolFlag(v string) error {
	switch strings.ToLower(v) {
	case "true", "1":
		return nil
	case "":
		return fmt.Errorf("not set")
	}
	return fmt.Errorf("value %q is not true", v)
}

func hasGates(gates ...string) func(string) error {
	return func(v string) error {
		have := map[string]bool{}
		for _, g := range strings.Split(v, ",") {
			have[strings.TrimSpace(g)] = true
		}
		for _, g := range gates {
			if !have[g] {
				return fmt.Errorf("missing %s", g)
			}
		}
		return nil
	}
}
