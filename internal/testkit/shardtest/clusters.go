package shardtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// Clusters are etcd servers, each its own cluster (on an external cluster:
// connections to it, whose tests use namespaces of their own), and a
// client of each.
type Clusters struct {
	// Servers are the servers, started in parallel.
	Servers []*etcdtest.Server
	// Clients are a client of each server, in the order of Servers.
	Clients []*clientv3.Client
}

// Start starts n servers in parallel (each start-up takes about a second)
// and opens a client of each. On an error it closes what it started.
func Start(n int) (*Clusters, error) {
	c := &Clusters{Servers: make([]*etcdtest.Server, n), Clients: make([]*clientv3.Client, n)}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if c.Servers[i], errs[i] = etcdtest.StartMain(); errs[i] == nil {
				c.Clients[i], errs[i] = c.Servers[i].NewClient()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Close closes every client and server.
func (c *Clusters) Close() {
	for i := range c.Servers {
		if c.Clients[i] != nil {
			_ = c.Clients[i].Close()
		}
		if c.Servers[i] != nil {
			c.Servers[i].Close()
		}
	}
}

// Violations are the requests outside the test namespaces that the
// servers' clients refused (on an external cluster; none on embedded ones).
func (c *Clusters) Violations() []string {
	var out []string
	for _, s := range c.Servers {
		out = append(out, s.Violations()...)
	}
	return out
}

// Main is a TestMain's body: it starts n clusters, hands them to use, runs
// m, closes them and returns the exit code: 1 when a test failed, the
// clusters did not start, a request left the test namespaces, or (when all
// else passed) leaks, called as goleak.Find, finds a goroutine left over.
func Main(m *testing.M, n int, use func(*Clusters), leaks func(...goleak.Option) error) int {
	c, err := Start(n)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	use(c)
	code := m.Run()
	c.Close()
	if v := c.Violations(); len(v) > 0 {
		fmt.Fprintf(os.Stderr, "requests outside the test namespaces were refused: %q\n", v)
		code = 1
	}
	if code == 0 {
		if err := leaks(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// Namespaces returns n store configurations, the i-th on clients[i mod
// len(clients)] in a fresh namespace of its own, whose keys are deleted at
// t's cleanup.
func Namespaces(t testing.TB, clients []*clientv3.Client, n int) []etcdstore.Config {
	t.Helper()
	out := make([]etcdstore.Config, n)
	for i := range out {
		c, ns := clients[i%len(clients)], etcdtest.Namespace()
		out[i] = etcdstore.Config{Client: c, Namespace: ns}
		t.Cleanup(func() { _, _ = c.Delete(context.Background(), ns, clientv3.WithPrefix()) })
	}
	return out
}
