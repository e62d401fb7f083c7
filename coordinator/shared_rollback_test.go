package coordinator_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/coordinator"
)

// Callers sharing one admission get the same *RollbackError; turning its
// deadline into DeadlineExceeded changes a copy (run with -race).
func TestSharedRollbackErrorIsNotRewritten(t *testing.T) {
	e := newEnv(t, memoryFactory)
	c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{CleanupTimeout: 50 * time.Millisecond}, localTarget())
	started := make(chan struct{})
	var once sync.Once
	mat := func(ctx context.Context, _ coordinator.Target, _ *authority.Snapshot) (coordinator.Materialized, error) {
		once.Do(func() { close(started) })
		<-ctx.Done()
		time.Sleep(20 * time.Millisecond) // let the losers reach the admission
		return coordinator.Materialized{}, ctx.Err()
	}
	discard := func(context.Context) error { return errors.New("discard failed") }
	var wg sync.WaitGroup
	wg.Go(func() {
		req := request("spot-1")
		req.Timeout = 200 * time.Millisecond
		_, err := c.GetOrCreate(e.ctx, req, mat, discard)
		assert.ErrorIs(t, err, coordinator.KindDeadlineExceeded)
		var rb *coordinator.RollbackError
		assert.ErrorAs(t, err, &rb)
	})
	<-started
	for range 4 {
		wg.Go(func() {
			req := request("spot-1")
			req.Timeout = 5 * time.Second
			_, err := c.GetOrCreate(e.ctx, req, mat, discard)
			// the losers share the winner's outcome
			assert.ErrorIs(t, err, coordinator.KindDeadlineExceeded)
			var rb *coordinator.RollbackError
			assert.ErrorAs(t, err, &rb)
		})
	}
	wg.Wait()
}
