package pgtest

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestStartServesOnSocketOnlyAndStopRemovesAll starts a real server, checks
// it serves SQL on its socket with no TCP listener and the settings Start
// promises, and that Stop ends the process and removes the directory.
func TestStartServesOnSocketOnlyAndStopRemovesAll(t *testing.T) {
	ctx := context.Background()
	s, skip, err := StartMain("application_name=pgtest_probe")
	require.NoError(t, err)
	if s == nil {
		t.Skip(skip)
	}
	defer s.Stop()

	dsn, err := s.CreateDatabase(ctx, "probe")
	require.NoError(t, err)
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer db.Close()

	settings := map[string]string{}
	for _, name := range []string{"listen_addresses", "fsync", "track_commit_timestamp", "application_name", "unix_socket_directories"} {
		var v string
		require.NoError(t, db.QueryRowContext(ctx, "SELECT current_setting($1)", name).Scan(&v))
		settings[name] = v
	}
	require.Equal(t, "", settings["listen_addresses"], "no TCP listener")
	require.Equal(t, "off", settings["fsync"])
	require.Equal(t, "on", settings["track_commit_timestamp"])
	require.Equal(t, s.SocketDir(), settings["unix_socket_directories"])
	require.True(t, strings.HasPrefix(s.SocketDir(), s.dir))
	var dbName string
	require.NoError(t, db.QueryRowContext(ctx, "SELECT current_database()").Scan(&dbName))
	require.Equal(t, "probe", dbName)
	require.NoError(t, db.Close())

	_, err = s.CreateDatabase(ctx, "Bad-Name")
	require.Error(t, err)

	pid := s.cmd.Process.Pid
	require.NoError(t, s.Stop())
	require.NoError(t, s.Stop(), "second Stop is a no-op")
	_, err = os.Stat(s.dir)
	require.True(t, os.IsNotExist(err), "directory removed: %v", err)
	_, err = os.Stat(filepath.Join("/proc", strconv.Itoa(pid)))
	require.True(t, os.IsNotExist(err), "postgres process %d gone", pid)
}

func TestBinDirHonoursOverride(t *testing.T) {
	t.Setenv(EnvBinDir, t.TempDir())
	_, err := BinDir()
	require.ErrorIs(t, err, ErrNotInstalled)
}

func TestRequired(t *testing.T) {
	t.Setenv("CI", "")
	t.Setenv(EnvRequire, "")
	require.False(t, Required())
	t.Setenv("CI", "true")
	require.True(t, Required())
	t.Setenv("CI", "")
	t.Setenv(EnvRequire, "1")
	require.True(t, Required())
}

// TestStartMainFailsWhenRequiredAndMissing: with the binaries missing, a
// required run gets an error, an optional one a skip reason.
func TestStartMainFailsWhenRequiredAndMissing(t *testing.T) {
	t.Setenv(EnvBinDir, t.TempDir())
	t.Setenv("CI", "")
	t.Setenv(EnvRequire, "")
	s, skip, err := StartMain()
	require.NoError(t, err)
	require.Nil(t, s)
	require.Contains(t, skip, "not found")
	t.Setenv(EnvRequire, "1")
	s, _, err = StartMain()
	require.ErrorIs(t, err, ErrNotInstalled)
	require.Nil(t, s)
}
