package main

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zlink-systems/authority/internal/embedded"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestWatchAcrossARestart: while its etcd is down, watch warns on stderr;
// when the server is back it says nothing was missed, and goes on with the
// next change.
func TestWatchAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	start := func() *embedded.Server {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		srv, err := embedded.Start(ctx, embedded.Config{Dir: dir, ClientAddr: addr, LogOutput: io.Discard})
		require.NoError(t, err)
		return srv
	}
	srv := start()
	defer func() { srv.Close() }()
	put := func(key string) {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		require.NoError(t, err)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err = c.Put(ctx, "/w/rows/actor/"+key, "not a row")
		require.NoError(t, err)
	}

	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		done <- run(ctx, []string{"--endpoints", addr, "--namespace", "/w/", "--dial-timeout", "2s", "watch"},
			&stdout, &stderr, func(string) string { return "" })
	}()
	waitFor := func(what string, in *syncBuffer) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !strings.Contains(in.String(), what) {
			select {
			case code := <-done:
				t.Fatalf("watch exited %d before %q:\nstdout: %s\nstderr: %s", code, what, stdout.String(), stderr.String())
			default:
			}
			require.True(t, time.Now().Before(deadline), "no %q:\nstdout: %s\nstderr: %s", what, stdout.String(), stderr.String())
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("REV", &stdout) // the watch is about to start: keep putting until it sees one
	for i := 0; !strings.Contains(stdout.String(), "actor/first"); i++ {
		put("first")
		time.Sleep(50 * time.Millisecond)
		require.Less(t, i, 600, "the watch saw no change")
	}
	srv.Close()
	waitFor("warning: disconnected from etcd", &stderr)
	srv = start()
	waitFor("note: reconnected to etcd", &stderr)
	require.Contains(t, stderr.String(), "nothing missed")
	put("second")
	waitFor("actor/second", &stdout)
	stop()
	require.Equal(t, exitInterrupted, <-done, stderr.String())
}
