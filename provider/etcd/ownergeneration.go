package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/observe"
)

// ErrGenerationTaken reports that AcquireGeneration's generation is not above
// the last one handed to the owner in this namespace: another Acquire took it
// or a later one (the lease generation is lost here; take a new one).
var ErrGenerationTaken = errors.New("etcd: owner lease generation already taken")

// AcquireGeneration grants the owner lease generation token on node's
// lifecycle, as Acquire does, except that the generation is token's, not the
// next one of this namespace: it holds only while it is above the last
// generation handed to token.OwnerID here, in the Txn that records it (the
// owner generation key's ModRevision is compared), so generations still only
// rise in every namespace. A store over several clusters (provider/sharded)
// takes an owner's generation in its home shard with Acquire and the same
// generation in every other shard with AcquireGeneration. A generation at or
// below the last one is ErrGenerationTaken (wrapping ErrLeaseLost), nothing
// written.
func (r *Registry) AcquireGeneration(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, token authority.OwnerToken, ttl time.Duration) (l *OwnerLease, err error) {
	ctx, op := r.s.obs.Start(ctx, observe.OpOwnerLeaseAcquire)
	defer func() { op.End("", err) }()
	if err = r.s.refuseWrite(); err != nil {
		return nil, err
	}
	if token.LeaseGeneration < 1 || token.LeaseGeneration > authority.MaxGeneration {
		return nil, authority.Invalid(fmt.Sprintf("Owner lease generation %d is outside 1..%d.", token.LeaseGeneration, authority.MaxGeneration))
	}
	return r.acquireNext(ctx, node, lifecycle, token.OwnerID, ttl, func(last int64) (int64, error) {
		if last >= token.LeaseGeneration {
			return 0, fmt.Errorf("%w: owner %q has generation %d in namespace %s, at or above %d: %w",
				ErrGenerationTaken, token.OwnerID, last, r.s.keys.Namespace(), token.LeaseGeneration, ErrLeaseLost)
		}
		return token.LeaseGeneration, nil
	})
}
