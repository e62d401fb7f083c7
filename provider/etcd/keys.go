package etcd

import (
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultNamespace is the namespace of a Config that names none.
const DefaultNamespace = "/zlink/authority/v1/"

// prefixEnd returns the end of the range of keys starting with prefix.
func prefixEnd(prefix string) string { return clientv3.GetPrefixRangeEnd(prefix) }

// itoa is the decimal text of n (an owner generation's value, figures in
// messages).
func itoa(n int64) string { return strconv.FormatInt(n, 10) }
