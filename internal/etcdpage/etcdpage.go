// Package etcdpage reads etcd key ranges in pages that fit the client's
// receive limit (MaxCallRecvMsgSize). A range whose values are large (rows
// with 1 MiB payloads, terminal envelopes, aggregate records) can make a
// response of a few hundred keys larger than that limit; gRPC then refuses
// the whole response and the same read fails on every retry. Read splits
// such a read into smaller ones at the same revision, so every range stays
// readable whatever its values hold.
package etcdpage

import (
	"context"
	"errors"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Page is the outcome of Read.
type Page struct {
	// Kvs are the keys read, in key order.
	Kvs []*mvccpb.KeyValue
	// Revision is the revision the page was read at.
	Revision int64
	// More says keys of the range follow the last one read.
	More bool
}

// Read reads up to limit keys of [from, end) at rev (0: the current
// revision; the page then reports the one it read at), with opts added to
// every range request. A response the client refuses as over its receive
// limit is read again in halves (one key at a time at worst); only a single
// key over the limit fails, with the client's error (see TooLarge).
func Read(ctx context.Context, kv clientv3.KV, from, end string, rev int64, limit int64, opts ...clientv3.OpOption) (Page, error) {
	var p Page
	p.Revision = rev
	step := limit
	for int64(len(p.Kvs)) < limit {
		o := append([]clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(min(step, limit-int64(len(p.Kvs))))}, opts...)
		if p.Revision > 0 {
			o = append(o, clientv3.WithRev(p.Revision))
		}
		resp, err := kv.Get(ctx, from, o...)
		if err != nil {
			if TooLarge(err) && step > 1 {
				step /= 2
				continue
			}
			return Page{}, err
		}
		if p.Revision == 0 {
			p.Revision = resp.Header.Revision
		}
		p.Kvs = append(p.Kvs, resp.Kvs...)
		if p.More = resp.More && len(resp.Kvs) > 0; !p.More {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return p, nil
}

// Rest reads every key after last up to end at rev, pageSize keys a request:
// the continuation of a range a Txn read with a limit (last is the key the
// Txn's range ended on).
func Rest(ctx context.Context, kv clientv3.KV, last, end string, rev int64, pageSize int64, opts ...clientv3.OpOption) ([]*mvccpb.KeyValue, error) {
	kvs, _, err := readAll(ctx, kv, last+"\x00", end, rev, pageSize, opts)
	return kvs, err
}

// All reads every key under prefix at one revision (rev, or the current one
// when 0), pageSize keys a request, and returns them with that revision.
func All(ctx context.Context, kv clientv3.KV, prefix string, rev int64, pageSize int64, opts ...clientv3.OpOption) ([]*mvccpb.KeyValue, int64, error) {
	return readAll(ctx, kv, prefix, clientv3.GetPrefixRangeEnd(prefix), rev, pageSize, opts)
}

// readAll reads [from, end) to its end in pages of pageSize at one revision.
func readAll(ctx context.Context, kv clientv3.KV, from, end string, rev int64, pageSize int64, opts []clientv3.OpOption) ([]*mvccpb.KeyValue, int64, error) {
	var out []*mvccpb.KeyValue
	for {
		p, err := Read(ctx, kv, from, end, rev, pageSize, opts...)
		if err != nil {
			return nil, 0, err
		}
		out, rev = append(out, p.Kvs...), p.Revision
		if !p.More {
			return out, rev, nil
		}
		from = string(p.Kvs[len(p.Kvs)-1].Key) + "\x00"
	}
}

// TooLarge reports whether err is the client refusing a response over its
// receive limit (gRPC ResourceExhausted "received message larger than
// max"), as opposed to the server's own ResourceExhausted answers (too many
// requests, database space exceeded).
func TooLarge(err error) bool {
	if errors.Is(err, rpctypes.ErrTooManyRequests) || errors.Is(err, rpctypes.ErrNoSpace) {
		return false
	}
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), "received message")
}

// ErrNoStream is Stream's error when the server has no RangeStream (etcd
// before 3.7): the caller reads with Read instead.
var ErrNoStream = errors.New("etcd server has no RangeStream (before 3.7)")

// Stream reads up to limit keys of [from, end) at rev like Read, through
// etcd's RangeStream (3.7 and later), and says whether keys follow.
//
// A Range (or a Txn's range) with a limit answers the number of keys in the
// whole range, so etcd walks its key index from the first key to the
// range's end whatever the limit: a page costs every key after it, and
// reading a range page by page is quadratic in its keys. RangeStream reads
// in chunks without counting; Stream asks for the whole range and stops
// reading (ends the stream) once it has one key past limit, so a page costs
// its own keys (and at most the chunks the server sent ahead). A first page
// (rev 0) reads one key first for the current revision, which every chunk is
// then read at, as Read's later requests are.
//
// A server without RangeStream fails with ErrNoStream; a response the client
// refuses as over its receive limit with the client's error (TooLarge), for
// the caller to read with Read, which splits it.
func Stream(ctx context.Context, kv clientv3.KV, from, end string, rev int64, limit int64, opts ...clientv3.OpOption) (Page, error) {
	if rev == 0 {
		resp, err := kv.Get(ctx, from, clientv3.WithKeysOnly())
		if err != nil {
			return Page{}, err
		}
		rev = resp.Header.Revision
	}
	return stream(ctx, kv, from, end, rev, limit, opts)
}

// Scan reads up to limit keys of [from, end) as they are now, like Stream,
// without first asking for the current revision: for a caller that needs
// no revision to read later pages at, because it fences every key it acts
// on by that key's own ModRevision (an owner's removal or rebind). The
// server reads every chunk at the revision it started at, but sends that
// revision only with the range's last chunk: Page.Revision is 0 unless the
// stream reached the range's end. Errors are Stream's.
func Scan(ctx context.Context, kv clientv3.KV, from, end string, limit int64, opts ...clientv3.OpOption) (Page, error) {
	return stream(ctx, kv, from, end, 0, limit, opts)
}

// stream is Stream at rev, or, with rev 0, at the revision the server
// starts the stream at (Page.Revision then 0 unless the range ended).
func stream(ctx context.Context, kv clientv3.KV, from, end string, rev int64, limit int64, opts []clientv3.OpOption) (Page, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	o := append([]clientv3.OpOption{clientv3.WithRange(end)}, opts...)
	if rev > 0 {
		o = append(o, clientv3.WithRev(rev))
	}
	ch, err := kv.GetStream(sctx, from, o...)
	if err != nil {
		return Page{}, streamError(err)
	}
	defer func() {
		cancel()
		for range ch { // the client's reader ends once the stream is cancelled
		}
	}()
	p := Page{Revision: rev}
	for r := range ch {
		if err := r.Err(); err != nil {
			return Page{}, streamError(err)
		}
		p.Kvs = append(p.Kvs, r.Kvs...)
		if r.Header != nil && p.Revision == 0 { // the last chunk of the range
			p.Revision = r.Header.Revision
		}
		if int64(len(p.Kvs)) > limit {
			p.Kvs, p.More = p.Kvs[:limit:limit], true
			return p, nil
		}
	}
	if err := ctx.Err(); err != nil {
		// the stream ended because the caller gave up, not at the range's end
		return Page{}, err
	}
	return p, nil
}

// streamError is ErrNoStream for a server without RangeStream, else err.
func streamError(err error) error {
	if status.Code(err) == codes.Unimplemented {
		return ErrNoStream
	}
	return err
}
