package embedded

import (
	"bytes"
	"testing"

	"go.uber.org/zap"
)

func TestMemberConfigDefaultsAndOverrides(t *testing.T) {
	def := Member{Name: "m", Dir: t.TempDir()}.Config()
	if def.MaxTxnOps != DefaultMaxTxnOps || def.MaxRequestBytes != DefaultMaxRequestBytes ||
		def.AutoCompactionMode != DefaultAutoCompactionMode || def.AutoCompactionRetention != DefaultAutoCompactionRetention {
		t.Errorf("defaults: ops %d, bytes %d, compaction %q/%q", def.MaxTxnOps, def.MaxRequestBytes, def.AutoCompactionMode, def.AutoCompactionRetention)
	}
	if !def.UnsafeNoFsync || def.InitialCluster == "" || def.EnableGRPCGateway {
		t.Errorf("defaults: nofsync %v, initial cluster %q, gateway %v", def.UnsafeNoFsync, def.InitialCluster, def.EnableGRPCGateway)
	}
	set := Member{Name: "m", Dir: t.TempDir(), Fsync: true, MaxTxnOps: 1024, MaxRequestBytes: 4 << 20,
		AutoCompactionRetention: "0", InitialCluster: "m=http://127.0.0.1:1", ClusterState: "existing", QuotaBackendBytes: 8 << 20}.Config()
	if set.UnsafeNoFsync || set.MaxTxnOps != 1024 || set.MaxRequestBytes != 4<<20 || set.AutoCompactionRetention != "0" ||
		set.InitialCluster != "m=http://127.0.0.1:1" || set.ClusterState != "existing" || set.QuotaBackendBytes != 8<<20 {
		t.Errorf("overrides not applied: %+v", set)
	}
}

func TestQuietLoggerDropsTheShutdownListenerError(t *testing.T) {
	var buf bytes.Buffer
	l := QuietLogger(&buf).With(zap.String("member", "m"))
	l.Error("setting up serving from embedded etcd failed.")
	l.Warn("a warning")
	if buf.Len() != 0 {
		t.Fatalf("logged %q", buf.String())
	}
	l.Error("a real error")
	if !bytes.Contains(buf.Bytes(), []byte("a real error")) {
		t.Fatalf("error not logged: %q", buf.String())
	}
}
