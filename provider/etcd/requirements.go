package etcd

import (
	"fmt"
	"strconv"
	"strings"
)

// ServerRequirement is one etcd server flag the provider needs set, and why.
type ServerRequirement struct {
	// Flag is the etcd server flag, e.g. "--max-txn-ops".
	Flag string
	// Why says what breaks without it.
	Why string
	// Check reports whether a flag value (as given on the command line, ""
	// when absent) meets the requirement, and if not, what is wrong.
	Check func(value string) error
}

// RecommendedMaxRequestBytes is the --max-request-bytes that lets a full
// 1 MiB payload travel together with its inline creation content reference
// (a 1 MiB request encodes to about 1.4 MiB) in one reservation.
const RecommendedMaxRequestBytes = 4 * 1024 * 1024

// ServerRequirements lists the etcd server settings this provider relies on.
// The README documents them, and a test checks docker-compose.yml against
// them so the two never drift. Set Config.MaxTxnOps and
// Config.MaxRequestBytes to the values the servers run with.
var ServerRequirements = []ServerRequirement{
	{
		Flag: "--max-txn-ops",
		Why: "an aggregate commits all participants in one Txn; a 16-participant move needs about 100 ops " +
			"(Config.MaxTxnOps must equal the server's value)",
		Check: atLeast(DefaultMaxTxnOps),
	},
	{
		Flag: "--max-request-bytes",
		Why: "a row carries up to 1 MiB of payload plus its creation content reference; " +
			"the default 1.5 MiB refuses full-size creations (Config.MaxRequestBytes must equal the server's value)",
		Check: atLeast(RecommendedMaxRequestBytes),
	},
	{
		Flag:  "--auto-compaction-retention",
		Why:   "etcd keeps every revision of every row until something compacts; without it the database grows until NOSPACE",
		Check: nonZero,
	},
	{
		Flag: "--feature-gates",
		Why: "lease checkpointing keeps owner-lease TTLs across leader changes, " +
			"so a dead owner's liveness expires on time instead of being extended by every election",
		Check: hasGates("LeaseCheckpoint=true", "LeaseCheckpointPersist=true"),
	},
}

func atLeast(min int64) func(string) error {
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
