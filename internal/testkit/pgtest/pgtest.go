// Package pgtest starts a throwaway PostgreSQL server for tests: Debian's
// (or any) PostgreSQL server binaries, a fresh cluster made by initdb in a
// temporary directory, listening on a Unix socket in that directory only (no
// TCP port at all), stopped and removed by Stop.
//
// A test package starts one server in TestMain with StartMain, which tells it
// whether to skip: the tests skip, with the reason StartMain gives, only when
// the server binaries are not installed and the run does not require them
// (Required: CI=true or AUTHORITY_REQUIRE_POSTGRES=1 make a missing server a
// failure, so CI can never skip silently).
//
// PostgreSQL refuses to run as root. When the test runs as root, pgtest runs
// initdb and the server as the "postgres" system user (created by Debian's
// postgresql package; AUTHORITY_PG_USER names another), owning the temporary
// directory; as any other user it runs them as that user.
package pgtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// Environment variables read by pgtest.
const (
	// EnvRequire set to "1" makes a missing server a failure (as CI=true does).
	EnvRequire = "AUTHORITY_REQUIRE_POSTGRES"
	// EnvBinDir names the directory holding initdb and postgres; by default
	// the newest /usr/lib/postgresql/<version>/bin, else the PATH.
	EnvBinDir = "AUTHORITY_PG_BINDIR"
	// EnvUser names the system user the server runs as when the test runs as
	// root; by default "postgres".
	EnvUser = "AUTHORITY_PG_USER"
)

// ErrNotInstalled reports that the PostgreSQL server binaries were not found.
var ErrNotInstalled = errors.New("pgtest: PostgreSQL server binaries (initdb, postgres) not found")

// Required reports whether this run must not skip the PostgreSQL tests: in CI
// (CI=true) or when AUTHORITY_REQUIRE_POSTGRES=1.
func Required() bool {
	return os.Getenv("CI") == "true" || os.Getenv(EnvRequire) == "1"
}

// BinDir returns the directory holding initdb and postgres, or an error
// wrapping ErrNotInstalled.
func BinDir() (string, error) {
	if dir := os.Getenv(EnvBinDir); dir != "" {
		if !hasServer(dir) {
			return "", fmt.Errorf("%w in %s=%s", ErrNotInstalled, EnvBinDir, dir)
		}
		return dir, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(matches, func(i, j int) bool { return versionOf(matches[i]) > versionOf(matches[j]) })
	for _, dir := range matches {
		if hasServer(dir) {
			return dir, nil
		}
	}
	if path, err := exec.LookPath("initdb"); err == nil && hasServer(filepath.Dir(path)) {
		return filepath.Dir(path), nil
	}
	return "", fmt.Errorf("%w (looked in /usr/lib/postgresql/*/bin and PATH; "+
		"install Debian's postgresql package or set %s)", ErrNotInstalled, EnvBinDir)
}

// versionOf returns the major version in /usr/lib/postgresql/<version>/bin.
func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func hasServer(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() {
			return false
		}
	}
	return true
}

// account is who initdb and the server run as: nil for the current user.
func account() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	name := os.Getenv(EnvUser)
	if name == "" {
		name = "postgres"
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root, and PostgreSQL refuses root: "+
			"need the system user %q to run the server as (Debian's postgresql package creates it; %s names another): %w",
			name, EnvUser, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil || uid == 0 {
		return nil, fmt.Errorf("pgtest: system user %q has uid %s gid %s: need a non-root numeric account", name, u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// serverEnv is the environment without the PG* variables, which would
// otherwise steer initdb and the server (PGDATA, PGPORT, ...).
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return append(env, "LC_ALL=C")
}
