package schema

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// SegStoreVersion is the layout segment of the namespace's active version
// and of the announcements of the stores that run on it.
const SegStoreVersion = "store-version"

// ActiveVersion is the key of the namespace's active store version
// (storeversion): absent means storeversion.Base.
func (l Layout) ActiveVersion() string { return l.ns + SegStoreVersion + "/active" }

// AnnouncementsPrefix is the prefix of every announcement.
func (l Layout) AnnouncementsPrefix() string { return l.ns + SegStoreVersion + "/announcements/" }

// Announcement is the key of the announcement attached to etcd lease id: one
// per lease a store holds (its own, and each owner lease's), so that a live
// owner liveness key whose lease has no announcement is known to be an
// earlier build's.
func (l Layout) Announcement(id int64) string {
	return l.AnnouncementsPrefix() + fmt.Sprintf("%016x", uint64(id))
}

// AnnouncementLease returns the etcd lease an announcement key names.
func (l Layout) AnnouncementLease(key string) (int64, error) {
	rest, ok := strings.CutPrefix(key, l.AnnouncementsPrefix())
	if !ok || len(rest) != 16 {
		return 0, corrupt(key, errBadKey)
	}
	id, err := strconv.ParseUint(rest, 16, 64)
	if err != nil {
		return 0, corrupt(key, errBadKey)
	}
	return int64(id), nil
}

// Announcement is what a running store (or authorityctl) says of itself: the
// range of store versions it works at, and which build it is.
type Announcement struct {
	Build   string    `json:"b"`   // the build: module version or VCS revision
	Role    string    `json:"r"`   // "store", "authorityctl", or the caller's Config.Role
	Host    string    `json:"h"`   // the host name
	PID     int       `json:"p"`   // the process ID
	Min     int32     `json:"min"` // the oldest active version it works at
	Max     int32     `json:"max"` // the newest active version it works at
	Started time.Time `json:"s"`   // when the process announced
}

// Encode returns the stored value of a.
func (a Announcement) Encode() string {
	b, _ := json.Marshal(a)
	return string(b)
}

// Supports reports whether the announcing process works at v.
func (a Announcement) Supports(v storeversion.Version) bool {
	return int32(v) >= a.Min && int32(v) <= a.Max
}

// DecodeAnnouncement decodes an announcement strictly.
func DecodeAnnouncement(kv *mvccpb.KeyValue) (Announcement, error) {
	var a Announcement
	if err := decodeStrict(kv.Value, &a); err != nil {
		return a, corrupt(string(kv.Key), err)
	}
	if err := storedText(a.Build, "build"); err != nil {
		return a, corrupt(string(kv.Key), err)
	}
	if a.Min < 1 || a.Max < a.Min {
		return a, corrupt(string(kv.Key), fmt.Errorf("version range %d–%d", a.Min, a.Max))
	}
	return a, nil
}

// activeVersionWire is the stored value of the active-version key.
type activeVersionWire struct {
	V int32 `json:"v"`
}

// EncodeActiveVersion returns the stored value of the active-version key.
func EncodeActiveVersion(v storeversion.Version) string {
	b, _ := json.Marshal(activeVersionWire{V: int32(v)})
	return string(b)
}

// DecodeActiveVersion decodes the active-version key (nil: absent, which
// means storeversion.Base). A version this build does not know decodes: the
// caller decides (a later version is refused with a sentence, not as
// corrupt data).
func DecodeActiveVersion(kv *mvccpb.KeyValue) (storeversion.Version, error) {
	if kv == nil {
		return storeversion.Base, nil
	}
	var w activeVersionWire
	if err := decodeStrict(kv.Value, &w); err != nil {
		return 0, corrupt(string(kv.Key), err)
	}
	if w.V < 1 {
		return 0, corrupt(string(kv.Key), fmt.Errorf("store version %d", w.V))
	}
	return storeversion.Version(w.V), nil
}

// decodeStoreVersion decodes a key under SegStoreVersion.
func (e *Entry) decodeStoreVersion(namespace string, kv *mvccpb.KeyValue) error {
	l := Layout{ns: namespace}
	key := string(kv.Key)
	if key == l.ActiveVersion() {
		v, err := DecodeActiveVersion(kv)
		e.ActiveVersion = v
		return err
	}
	id, err := l.AnnouncementLease(key)
	if err != nil {
		return err
	}
	a, err := DecodeAnnouncement(kv)
	if err != nil {
		return err
	}
	e.Announcement, e.Lease = &a, id
	return nil
}
