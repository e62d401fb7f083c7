package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Superuser is the role initdb creates; connections over the socket are
// trusted.
const Superuser = "postgres"

// port only names the socket file (.s.PGSQL.<port>): no TCP port is opened.
const port = "5432"

// readyTimeout bounds how long Start waits for the server to accept
// connections.
const readyTimeout = 60 * time.Second

// stopTimeout bounds how long Stop waits for a fast shutdown before killing.
const stopTimeout = 30 * time.Second

// Server is a running throwaway PostgreSQL server.
type Server struct {
	dir      string // temporary root: data/, socket/, server.log
	sockDir  string
	cmd      *exec.Cmd
	exited   chan struct{}
	waitErr  error
	stopOnce sync.Once
	stopErr  error
}

// StartMain starts a server for a TestMain. When the server binaries are
// missing and the run does not require them (Required), it returns a nil
// Server and the reason to skip with; when they are missing and required, or
// the server fails to start, it returns an error.
func StartMain(settings ...string) (s *Server, skipReason string, err error) {
	s, err = Start(context.Background(), settings...)
	if errors.Is(err, ErrNotInstalled) && !Required() {
		return nil, fmt.Sprintf("%v (CI=true or %s=1 make this a failure)", err, EnvRequire), nil
	}
	return s, "", err
}

// Start makes a cluster with initdb in a new temporary directory and starts
// the server on a Unix socket there, with no TCP listener, fsync off, and
// track_commit_timestamp on. settings are extra "name=value" server settings
// (passed as -c). The caller must Stop it.
func Start(ctx context.Context, settings ...string) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	cred, err := account()
	if err != nil {
		return nil, err
	}
	dir, err := tempDir(cred)
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, sockDir: filepath.Join(dir, "socket"), exited: make(chan struct{})}
	if err := s.launch(ctx, bin, cred, settings); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// tempDir makes a private directory short enough for a socket path (at most
// 107 bytes), owned by the server's account.
func tempDir(cred *syscall.Credential) (string, error) {
	base := os.TempDir()
	if len(base) > 60 {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, "pgtest-")
	if err != nil {
		return "", err
	}
	if err := os.Mkdir(filepath.Join(dir, "socket"), 0o700); err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	if cred != nil {
		for _, d := range []string{dir, filepath.Join(dir, "socket")} {
			if err := os.Chown(d, int(cred.Uid), int(cred.Gid)); err != nil {
				_ = os.RemoveAll(dir)
				return "", err
			}
		}
	}
	return dir, nil
}

func (s *Server) launch(ctx context.Context, bin string, cred *syscall.Credential, settings []string) error {
	data := filepath.Join(s.dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", Superuser,
		"--auth=trust", "--encoding=UTF8", "--no-locale", "--no-sync")
	initdb.Dir, initdb.Env = s.dir, serverEnv()
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	logFile, err := os.Create(filepath.Join(s.dir, "server.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	args := []string{"-D", data, "-p", port, "-c", "listen_addresses=", "-c", "unix_socket_directories=" + s.sockDir,
		"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "track_commit_timestamp=on"}
	for _, kv := range settings {
		args = append(args, "-c", kv)
	}
	// The server is a direct child (not daemonised by pg_ctl) so that it
	// dies with the test process (Pdeathsig: SIGQUIT is an immediate
	// shutdown) even when a test panics before Stop.
	s.cmd = exec.Command(filepath.Join(bin, "postgres"), args...)
	s.cmd.Dir, s.cmd.Env, s.cmd.Stdout, s.cmd.Stderr = s.dir, serverEnv(), logFile, logFile
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT}
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	go func() { s.waitErr = s.cmd.Wait(); close(s.exited) }()
	if err := s.waitReady(ctx); err != nil {
		_ = s.Stop()
		return err
	}
	return nil
}

// waitReady polls until the server accepts a connection.
func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, s.DSN("postgres"))
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-s.exited:
			return fmt.Errorf("pgtest: postgres exited (%v) before accepting connections:\n%s", s.waitErr, s.Log())
		case <-ctx.Done():
			return fmt.Errorf("pgtest: postgres not ready after %v: %w (last: %v)\n%s", readyTimeout, ctx.Err(), err, s.Log())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// DSN returns the keyword/value connection string of database on the
// server's socket, for pgx (sql.Open("pgx", dsn) with pgx/v5/stdlib).
func (s *Server) DSN(database string) string {
	return fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable", s.sockDir, port, Superuser, database)
}

// SocketDir returns the directory of the server's Unix socket.
func (s *Server) SocketDir() string { return s.sockDir }

// Log returns the server log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	return string(bytes.TrimSpace(b))
}

// databaseName is what CreateDatabase accepts.
var databaseName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// CreateDatabase creates an empty database and returns its DSN. name must be
// lower-case letters, digits and '_' (at most 63, not starting with a digit).
func (s *Server) CreateDatabase(ctx context.Context, name string) (string, error) {
	if !databaseName.MatchString(name) {
		return "", fmt.Errorf("pgtest: database name %q: need [a-z_][a-z0-9_]{0,62}", name)
	}
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `CREATE DATABASE "`+name+`"`); err != nil {
		return "", fmt.Errorf("pgtest: create database %s: %w", name, err)
	}
	return s.DSN(name), nil
}

// Stop shuts the server down (fast shutdown: open transactions are rolled
// back) and removes its directory. It is safe to call more than once.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		if s.cmd != nil && s.cmd.Process != nil {
			_ = s.cmd.Process.Signal(syscall.SIGINT)
			select {
			case <-s.exited:
			case <-time.After(stopTimeout):
				_ = s.cmd.Process.Kill()
				<-s.exited
				s.stopErr = fmt.Errorf("pgtest: postgres did not stop within %v: killed", stopTimeout)
			}
		}
		if err := os.RemoveAll(s.dir); err != nil && s.stopErr == nil {
			s.stopErr = err
		}
	})
	return s.stopErr
}
