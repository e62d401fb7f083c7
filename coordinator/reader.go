package coordinator

import (
	"context"

	authority "github.com/zlink-systems/authority"
)

// RowReader reads authority rows. The store is one; a local read view
// (package view) is another: its reads (consistent, the default) are
// linearizable like the store's, and answered from memory. The reader's
// rows must include the coordinator's kind (a view on its KindPrefix, or on
// every row).
type RowReader interface {
	// ReadAuthority returns the row at key (KindSnapshot) or KindMissing.
	ReadAuthority(ctx context.Context, key authority.Key) (authority.ReadResult, error)
}

// read reads the row at key through the configured reader (the store when
// none is).
func (c *UserSpotCoordinator) read(ctx context.Context, key authority.Key) (authority.ReadResult, error) {
	if c.opts.Reader != nil {
		return c.opts.Reader.ReadAuthority(ctx, key)
	}
	return c.opts.Store.ReadAuthority(ctx, key)
}

// read reads the row at key through the configured reader (the store when
// none is).
func (a *InstanceActivationAuthority) read(ctx context.Context, key authority.Key) (authority.ReadResult, error) {
	if a.opts.Reader != nil {
		return a.opts.Reader.ReadAuthority(ctx, key)
	}
	return a.opts.Store.ReadAuthority(ctx, key)
}
