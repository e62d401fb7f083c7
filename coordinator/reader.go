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

// readerOr returns reader, or store when no reader is configured.
func readerOr(reader, store RowReader) RowReader {
	if reader != nil {
		return reader
	}
	return store
}

// rows is the User Spot coordinator's row reader: the configured reader,
// else the store.
func (c *UserSpotCoordinator) rows() RowReader { return readerOr(c.opts.Reader, c.opts.Store) }

// rows is the Instance authority's row reader: the configured reader, else
// the store.
func (a *InstanceActivationAuthority) rows() RowReader { return readerOr(a.opts.Reader, a.opts.Store) }

// readFailed is the message of a failed read of a row of kind.
func readFailed(kind authority.ObjectKind) string {
	if kind == authority.ObjectInstanceSpot {
		return "Instance authority read failed."
	}
	return "User Spot authority read failed."
}

// readRow reads the row of kind at key through r; a failed read is
// KindRequestFailed (KindDeadlineExceeded when ctx ran out).
func readRow(ctx context.Context, r RowReader, kind authority.ObjectKind, key authority.Key) (authority.ReadResult, error) {
	res, err := r.ReadAuthority(ctx, key)
	if err != nil {
		return authority.ReadResult{}, failure(ctx, KindRequestFailed, readFailed(kind), err)
	}
	return res, nil
}

// readSpot reads the row of kind's spotID through r: the row's key and what
// the read found. A spot ID that makes no key is the key's error, a failed
// read is readRow's.
func readSpot(ctx context.Context, r RowReader, kind authority.ObjectKind, spotID string) (authority.Key, authority.ReadResult, error) {
	key, err := authority.EncodeKey(kind, spotID)
	if err != nil {
		return "", authority.ReadResult{}, err
	}
	res, err := readRow(ctx, r, kind, key)
	return key, res, err
}
