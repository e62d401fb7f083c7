package etcdcluster

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/zlink-systems/authority/internal/embedded"
)

// envMember names the environment variable that carries a member's
// configuration (JSON) to the re-executed test binary.
const envMember = "ETCDCLUSTER_MEMBER"

// Lines a member process writes on its standard output.
const (
	lineStarted = "etcdcluster: started"
	lineReady   = "etcdcluster: ready"
)

// memberConfig is what the parent tells a member process to run.
type memberConfig struct {
	Name                string `json:"name"`
	Dir                 string `json:"dir"`
	PeerURL             string `json:"peerURL"`
	ClientURL           string `json:"clientURL"`
	InitialCluster      string `json:"initialCluster"`
	InitialClusterState string `json:"initialClusterState"`
	InitialClusterToken string `json:"initialClusterToken"`
	TickMs              uint   `json:"tickMs"`
	ElectionMs          uint   `json:"electionMs"`
	Fsync               bool   `json:"fsync"`
	SnapshotCount       uint64 `json:"snapshotCount"`
	MaxTxnOps           uint   `json:"maxTxnOps"`
	MaxRequestBytes     uint   `json:"maxRequestBytes"`
}

// RunMemberIfRequested runs one etcd member and exits the process when the
// current process was started by Start as a member; otherwise it returns at
// once. Call it first thing in TestMain of every test package that uses
// Start.
func RunMemberIfRequested() {
	raw, ok := os.LookupEnv(envMember)
	if !ok {
		return
	}
	os.Exit(runMember(raw))
}

// runMember runs the member described by raw until SIGTERM (graceful stop,
// exit 0), SIGKILL, a server error or the parent's death (its end of our
// standard input closes).
func runMember(raw string) int {
	var mc memberConfig
	if err := json.Unmarshal([]byte(raw), &mc); err != nil {
		fmt.Fprintf(os.Stderr, "etcdcluster: bad %s: %v\n", envMember, err)
		return 2
	}
	cfg, err := mc.embedConfig()
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcdcluster: %v\n", err)
		return 2
	}
	// Register before starting so a SIGTERM during start-up is a graceful stop.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcdcluster: start member %s: %v\n", mc.Name, err)
		return 1
	}
	fmt.Fprintln(os.Stdout, lineStarted)

	// The parent holds our standard input open; when it dies, so do we.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(3)
	}()

	ready := e.Server.ReadyNotify()
	for {
		select {
		case <-ready:
			fmt.Fprintln(os.Stdout, lineReady)
			ready = nil
		case <-stop:
			e.Close()
			return 0
		case err := <-e.Err():
			fmt.Fprintf(os.Stderr, "etcdcluster: member %s: %v\n", mc.Name, err)
			e.Close()
			return 1
		case <-e.Server.StopNotify():
			fmt.Fprintf(os.Stderr, "etcdcluster: member %s stopped by itself\n", mc.Name)
			e.Close()
			return 1
		}
	}
}

// embedConfig translates mc into an embed.Config.
func (mc memberConfig) embedConfig() (*embed.Config, error) {
	peer, err := url.Parse(mc.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("peer URL: %w", err)
	}
	client, err := url.Parse(mc.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("client URL: %w", err)
	}
	return embedded.Member{
		Name: mc.Name, Dir: mc.Dir, PeerURL: *peer, ClientURL: *client,
		InitialCluster: mc.InitialCluster, ClusterState: mc.InitialClusterState, ClusterToken: mc.InitialClusterToken,
		TickMs: mc.TickMs, ElectionMs: mc.ElectionMs, SnapshotCount: mc.SnapshotCount,
		Fsync: mc.Fsync, MaxTxnOps: mc.MaxTxnOps, MaxRequestBytes: mc.MaxRequestBytes,
	}.Config(), nil
}
