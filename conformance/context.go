package conformance

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// RunTestContext checks that every operation honours a cancelled context:
// it fails with an error wrapping context.Canceled and writes nothing.
func RunTestContext(ctx context.Context, t *testing.T, f Factory) {
	type op struct {
		name string
		call func(ctx context.Context, fx *Fixture, w *world) error
	}
	ops := []op{
		{"ReadAuthority", func(ctx context.Context, fx *Fixture, w *world) error {
			_, err := fx.Store().ReadAuthority(ctx, w.actorKey)
			return err
		}},
		{"CompareExchangeAuthority", func(ctx context.Context, fx *Fixture, w *world) error {
			_, err := fx.Store().CompareExchangeAuthority(ctx, w.actorKey, w.actor.StoreVersion, authority.Put([]byte("x")))
			return err
		}},
		{"ListAuthorities", func(ctx context.Context, fx *Fixture, _ *world) error {
			_, err := fx.Store().ListAuthorities(ctx, authority.KindPrefix(authority.ObjectActor), "", 10)
			return err
		}},
		{"RemoveAllByOwner", func(ctx context.Context, fx *Fixture, _ *world) error {
			_, err := fx.Store().RemoveAllByOwner(ctx, OwnerA)
			return err
		}},
		{"Reserve", func(ctx context.Context, fx *Fixture, _ *world) error {
			_, err := fx.Store().Reserve(ctx, fx.ReserveRequest(authority.ObjectActor, "new", TargetA))
			return err
		}},
		{"Commit", func(ctx context.Context, fx *Fixture, w *world) error {
			_, err := fx.Store().Commit(ctx, w.spotRes.CommitRequest([]byte("ready")))
			return err
		}},
		{"CompleteCreation", func(ctx context.Context, fx *Fixture, w *world) error {
			_, err := fx.Store().CompleteCreation(ctx, w.actorRes.CompleteRequest(authority.TerminalCreated, []byte("ready"), fx.Publication()))
			return err
		}},
		{"ReadCreationTerminal", func(ctx context.Context, fx *Fixture, _ *world) error {
			_, err := fx.Store().ReadCreationTerminal(ctx, fx.Operation())
			return err
		}},
		{"Abort", func(ctx context.Context, fx *Fixture, w *world) error {
			_, err := fx.Store().Abort(ctx, w.spotRes.AbortRequest())
			return err
		}},
		{"PrepareAggregate", func(ctx context.Context, fx *Fixture, w *world) error {
			_, err := fx.Store().PrepareAggregate(ctx, w.move)
			return err
		}},
		{"CommitAggregate", func(ctx context.Context, fx *Fixture, w *world) error {
			fx.MustPrepare(w.move)
			_, err := fx.Store().CommitAggregate(ctx, w.validFence)
			if err != nil {
				if _, abortErr := fx.Store().AbortAggregate(fx.Ctx(), w.validFence); abortErr != nil {
					return abortErr
				}
			}
			return err
		}},
		{"AbortAggregate", func(ctx context.Context, fx *Fixture, w *world) error {
			fx.MustPrepare(w.move)
			_, err := fx.Store().AbortAggregate(ctx, w.validFence)
			if err != nil {
				if _, abortErr := fx.Store().AbortAggregate(fx.Ctx(), w.validFence); abortErr != nil {
					return abortErr
				}
			}
			return err
		}},
		{"CapacityUsage", func(ctx context.Context, fx *Fixture, _ *world) error {
			_, err := fx.Store().CapacityUsage(ctx, NodeA, NodeLifecycle, authority.ObjectActor, "")
			return err
		}},
	}
	for _, o := range ops {
		t.Run(o.name, func(t *testing.T) {
			fx := NewFixtureContext(ctx, t, f(t))
			w := newWorld(fx)
			before := fx.State()
			ctx, cancel := context.WithCancel(fx.Ctx())
			cancel()
			err := o.call(ctx, fx, w)
			require.Error(t, err)
			require.True(t, errors.Is(err, context.Canceled), "error %v does not wrap context.Canceled", err)
			fx.RequireState(before)
		})
	}
}
