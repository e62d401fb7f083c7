package faults_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
)

func TestMain(m *testing.M) {
	etcdcluster.RunMemberIfRequested()
	runPausedOwnerIfRequested()
	runDownstreamWriterIfRequested()
	runFailoverNodeIfRequested()
	runShard2PCChildIfRequested()
	runReshardNodeIfRequested()
	runReshardMoverIfRequested()
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { removeUpgradeBuilds() }))
}
