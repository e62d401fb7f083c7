package schema

import (
	"encoding/binary"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// EncodeBlob frames a relocation blob: its expiry as 8 bytes of big-endian
// Unix nanoseconds, then the data.
func EncodeBlob(expires time.Time, data []byte) string {
	value := make([]byte, 8, 8+len(data))
	binary.BigEndian.PutUint64(value, uint64(expires.UnixNano()))
	return string(append(value, data...))
}

// DecodeBlob splits a stored relocation blob into its expiry and data (data
// shares kv's bytes).
func DecodeBlob(kv *mvccpb.KeyValue) (time.Time, []byte, error) {
	if len(kv.Value) < 8 {
		return time.Time{}, nil, corrupt(string(kv.Key), errors.New("relocation blob shorter than its expiry"))
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(kv.Value[:8]))), kv.Value[8:], nil
}
