// Package throwawayetcd starts the single-member etcd server the examples
// run on when they get no -endpoints: in your program, that is your own
// cluster's endpoints.
package throwawayetcd

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/url"
	"os"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Start starts a single-member etcd server on a loopback port, in a
// temporary data directory that stop removes. It stands in for your own
// cluster when the program gets no -endpoints. Each start is a new cluster
// (a random cluster token): ownership tokens start low again.
func Start(ctx context.Context) (endpoint string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "authority-example-etcd-")
	if err != nil {
		return "", nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = "example", dir
	cfg.InitialClusterToken = "example-" + rand.Text()
	loopback := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{loopback}, []url.URL{loopback}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{loopback}, []url.URL{loopback}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop()) // its shutdown logs errors
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("start etcd: %w", err)
	}
	stop = func() {
		e.Close()
		<-e.Server.StopNotify()
		_ = os.RemoveAll(dir)
	}
	select {
	case <-e.Server.ReadyNotify():
		return e.Clients[0].Addr().String(), stop, nil
	case err := <-e.Err():
		stop()
		return "", nil, fmt.Errorf("etcd: %w", err)
	case <-ctx.Done():
		stop()
		return "", nil, ctx.Err()
	}
}
