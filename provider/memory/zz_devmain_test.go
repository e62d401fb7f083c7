package memory

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

var testEpoch = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
