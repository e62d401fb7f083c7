package schema

import (
	"encoding/json"
	"fmt"
	"strconv"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// EncodeOwnerGeneration returns the stored value of an owner generation key:
// the last lease generation handed to the owner, in decimal.
func EncodeOwnerGeneration(gen int64) string { return strconv.FormatInt(gen, 10) }

// DecodeOwnerGeneration decodes an owner generation key's value.
func DecodeOwnerGeneration(kv *mvccpb.KeyValue) (int64, error) {
	gen, err := strconv.ParseInt(string(kv.Value), 10, 64)
	if err != nil || gen < 0 {
		return 0, corrupt(string(kv.Key), fmt.Errorf("owner generation %q", kv.Value))
	}
	return gen, nil
}

// Liveness is the value of an owner liveness key.
type Liveness struct {
	MeshName  string `json:"m"` // the node's mesh
	RID       string `json:"r"` // the node's RID
	Lifecycle int64  `json:"g"` // the node's lifecycle generation
	OwnerID   string `json:"o"` // the owner
	Lease     int64  `json:"l"` // the owner's lease generation
}

// DecodeLiveness decodes a liveness key's value strictly.
func DecodeLiveness(value []byte) (Liveness, error) {
	var v Liveness
	if err := decodeStrict(value, &v); err != nil {
		return v, err
	}
	return v, v.check()
}

// Encode returns the stored value of l.
func (l Liveness) Encode() string {
	b, _ := json.Marshal(l)
	return string(b)
}
