package etcdcluster

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// echoServer answers every line with the same line until closed. It counts
// the lines it received.
type echoServer struct {
	ln    net.Listener
	mu    sync.Mutex
	lines int
	wg    sync.WaitGroup
	conns []net.Conn
}

func startEcho(t *testing.T) *echoServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &echoServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					s.mu.Lock()
					s.lines++
					s.mu.Unlock()
					if _, err := io.WriteString(c, line); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *echoServer) received() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lines
}

func startProxy(t *testing.T, target string) *proxy {
	p, err := newProxy(target)
	require.NoError(t, err)
	t.Cleanup(p.close)
	// below the ephemeral range: no outgoing connection takes the port
	// while the proxy drops
	_, port, err := net.SplitHostPort(p.addr)
	require.NoError(t, err)
	n, err := strconv.Atoi(port)
	require.NoError(t, err)
	require.True(t, n >= memberPortLow && n < memberPortHigh, "proxy port %d", n)
	return p
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c, bufio.NewReader(c)
}

// roundTrip sends line and reads the answer within d.
func roundTrip(c net.Conn, r *bufio.Reader, line string, d time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(d))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return got[:len(got)-1], nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestProxyPasses(t *testing.T) {
	echo := startEcho(t)
	p := startProxy(t, echo.ln.Addr().String())
	c, r := dial(t, p.addr)
	for _, line := range []string{"a", "bb", "ccc"} {
		got, err := roundTrip(c, r, line, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, line, got)
	}
	require.Equal(t, 3, echo.received())
}

func TestProxyBlackholeHoldsThenHealForwards(t *testing.T) {
	echo := startEcho(t)
	p := startProxy(t, echo.ln.Addr().String())
	c, r := dial(t, p.addr)
	_, err := roundTrip(c, r, "before", 5*time.Second)
	require.NoError(t, err)

	require.NoError(t, p.setMode(modeBlackhole))
	_, err = roundTrip(c, r, "held", 200*time.Millisecond)
	require.True(t, isTimeout(err), "existing connection must hang, got %v", err)

	// A new connection is accepted (no refusal) but nothing gets through.
	c2, r2 := dial(t, p.addr)
	_, err = roundTrip(c2, r2, "new", 200*time.Millisecond)
	require.True(t, isTimeout(err), "new connection must hang, got %v", err)
	require.Equal(t, 1, echo.received(), "nothing may reach the server while blackholed")

	require.NoError(t, p.setMode(modePass))
	// The held bytes are forwarded after the heal, in order.
	got, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "held\n", got)
	got, err = r2.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "new\n", got)
	got, err = roundTrip(c, r, "after", 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "after", got)
}

func TestProxyHoldRepliesForwardsRequestsOnly(t *testing.T) {
	echo := startEcho(t)
	p := startProxy(t, echo.ln.Addr().String())
	c, r := dial(t, p.addr)
	_, err := roundTrip(c, r, "before", 5*time.Second)
	require.NoError(t, err)

	require.NoError(t, p.setMode(modeHoldReplies))
	_, err = roundTrip(c, r, "request", 300*time.Millisecond)
	require.True(t, isTimeout(err), "the reply must be held, got %v", err)
	require.Eventually(t, func() bool { return echo.received() == 2 }, 5*time.Second, 10*time.Millisecond,
		"the request must reach the server")

	require.NoError(t, p.setMode(modePass))
	got, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "request\n", got)
}

func TestProxyDropClosesAndRefuses(t *testing.T) {
	echo := startEcho(t)
	p := startProxy(t, echo.ln.Addr().String())
	c, r := dial(t, p.addr)
	_, err := roundTrip(c, r, "before", 5*time.Second)
	require.NoError(t, err)

	require.NoError(t, p.setMode(modeDrop))
	_, err = roundTrip(c, r, "x", 5*time.Second)
	require.Error(t, err)
	require.False(t, isTimeout(err), "a dropped connection must fail at once, got %v", err)
	_, err = net.Dial("tcp", p.addr)
	require.ErrorIs(t, err, syscall.ECONNREFUSED)

	require.NoError(t, p.setMode(modePass))
	c2, r2 := dial(t, p.addr)
	got, err := roundTrip(c2, r2, "again", 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "again", got)
}

func TestProxyClosesClientWhenTargetDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	target := ln.Addr().String()
	require.NoError(t, ln.Close())
	p := startProxy(t, target)
	c, r := dial(t, p.addr)
	_, err = roundTrip(c, r, "x", 5*time.Second)
	require.Error(t, err)
	require.False(t, isTimeout(err), "must fail at once, got %v", err)
}
