package etcdcluster

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	RunMemberIfRequested()
	goleak.VerifyTestMain(m)
}
