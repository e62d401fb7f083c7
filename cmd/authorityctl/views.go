package main

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/coordinator"
)

// capacityView is a capacity vector in JSON/YAML.
type capacityView struct {
	Actors     int64  `json:"actors"`
	Spots      int64  `json:"spots"`
	SpotKind   string `json:"spotKind,omitempty"`
	StableType string `json:"stableType,omitempty"`
	TypeCount  int64  `json:"typeCount,omitempty"`
}

func viewCapacity(c authority.CapacityVector) capacityView {
	v := capacityView{Actors: c.Actors, Spots: c.Spots}
	if c.SpotType != nil {
		v.SpotKind, v.StableType, v.TypeCount = string(c.SpotType.ObjectKind), c.SpotType.StableType, c.SpotType.Count
	}
	return v
}

// String is the table form: "actors=1", "spots=1 user_spot:chat.Room=1".
func (c capacityView) String() string {
	var parts []string
	if c.Actors != 0 {
		parts = append(parts, "actors="+strconv.FormatInt(c.Actors, 10))
	}
	if c.Spots != 0 {
		parts = append(parts, "spots="+strconv.FormatInt(c.Spots, 10))
	}
	if c.SpotKind != "" {
		parts = append(parts, fmt.Sprintf("%s:%s=%d", c.SpotKind, c.StableType, c.TypeCount))
	}
	if len(parts) == 0 {
		return "0"
	}
	return strings.Join(parts, " ")
}

// recoveryView is an Instance activation's recovery record.
type recoveryView struct {
	Reference     string `json:"reference"`
	SHA256        string `json:"sha256"`
	EncodedSize   int64  `json:"encodedSize"`
	InboxSequence int64  `json:"inboxSequence"`
	ReplayCursor  int64  `json:"replayCursor"`
}

// payloadView is a row payload: decoded when it is a coordinator payload,
// else as base64 (and UTF-8 text when it is printable).
type payloadView struct {
	// Codec is "coordinator" or "raw".
	Codec                string        `json:"codec"`
	Kind                 string        `json:"kind,omitempty"`
	State                string        `json:"state,omitempty"`
	StableType           string        `json:"stableType,omitempty"`
	SpotID               string        `json:"spotId,omitempty"`
	OwnerID              string        `json:"ownerId,omitempty"`
	OwnerLeaseGeneration int64         `json:"ownerLeaseGeneration,omitempty"`
	OwnerMeshName        string        `json:"ownerMeshName,omitempty"`
	OwnerNodeRID         string        `json:"ownerNodeRid,omitempty"`
	OwnerNodeGeneration  int64         `json:"ownerNodeGeneration,omitempty"`
	Recovery             *recoveryView `json:"activationRecovery,omitempty"`
	Size                 int           `json:"size"`
	Base64               string        `json:"base64,omitempty"`
	Text                 string        `json:"text,omitempty"`
}

func viewPayload(b []byte) payloadView {
	if p, err := coordinator.DecodePayload(b); err == nil {
		v := payloadView{
			Codec: "coordinator", Kind: string(p.Kind), State: string(p.State), StableType: p.StableType,
			SpotID: p.SpotID, OwnerID: p.OwnerID, OwnerLeaseGeneration: p.OwnerLeaseGeneration,
			OwnerMeshName: p.OwnerMeshName, OwnerNodeRID: p.OwnerNodeRID, OwnerNodeGeneration: p.OwnerNodeGeneration,
			Size: len(b),
		}
		if r := p.ActivationRecovery; r != nil {
			v.Recovery = &recoveryView{Reference: r.Reference, SHA256: hex.EncodeToString(r.SHA256), EncodedSize: r.EncodedSize,
				InboxSequence: r.InboxSequence, ReplayCursor: r.ReplayCursor}
		}
		return v
	}
	v := payloadView{Codec: "raw", Size: len(b), Base64: base64.StdEncoding.EncodeToString(b)}
	if utf8.Valid(b) && printable(string(b)) {
		v.Text = string(b)
	}
	return v
}

func printable(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// String is the table form of a payload: its coordinator state, its text,
// or its first bytes in hex.
func (p payloadView) String() string {
	if p.Codec == "coordinator" {
		s := p.State
		if p.Recovery != nil {
			s += fmt.Sprintf(", inbox replayed %d/%d", p.Recovery.ReplayCursor, p.Recovery.InboxSequence)
		}
		return s
	}
	if p.Size == 0 {
		return "(empty)"
	}
	if p.Text != "" {
		if len(p.Text) > 24 {
			return strconv.Quote(p.Text[:24]) + "…"
		}
		return strconv.Quote(p.Text)
	}
	raw, _ := base64.StdEncoding.DecodeString(p.Base64)
	if len(raw) > 12 {
		return "hex:" + hex.EncodeToString(raw[:12]) + "…"
	}
	return "hex:" + hex.EncodeToString(raw)
}

// pendingView is a reserved row's creation receipt.
type pendingView struct {
	ReservationID           string `json:"reservationId"`
	RequestContentReference string `json:"requestContentReference"`
	RequestSHA256           string `json:"requestSha256"`
	RequestEncodedSize      int64  `json:"requestEncodedSize"`
}

// rowView is an authority row in JSON/YAML.
type rowView struct {
	Key                      string `json:"key"`
	ObjectKind               string `json:"objectKind"`
	GlobalID                 string `json:"globalId"`
	State                    string `json:"state"`
	StoreVersion             string `json:"storeVersion"`
	ObjectGeneration         int64  `json:"objectGeneration"`
	AuthorityOwnerGeneration int64  `json:"authorityOwnerGeneration"`
	OwnerID                  string `json:"ownerId"`
	OwnerLeaseGeneration     int64  `json:"ownerLeaseGeneration"`
	// OwnershipToken is the fencing token the row's owner sends with its
	// effects (Snapshot.OwnershipToken).
	OwnershipToken          int64        `json:"ownershipToken"`
	MeshName                string       `json:"meshName"`
	NodeRID                 string       `json:"nodeRid"`
	NodeLifecycleGeneration int64        `json:"nodeLifecycleGeneration"`
	StableType              string       `json:"stableType,omitempty"`
	Capacity                capacityView `json:"capacity"`
	PendingCreation         *pendingView `json:"pendingCreation,omitempty"`
	Payload                 payloadView  `json:"payload"`
}

func viewRow(key authority.Key, s *authority.Snapshot) rowView {
	v := rowView{
		Key: string(key), State: string(s.Allocation.State), StoreVersion: string(s.StoreVersion),
		ObjectGeneration: s.ObjectGeneration, AuthorityOwnerGeneration: s.AuthorityOwnerGeneration,
		OwnerID: s.OwnerID, OwnerLeaseGeneration: s.OwnerLeaseGeneration, OwnershipToken: s.OwnershipToken,
		MeshName: s.Allocation.Descriptor.MeshName, NodeRID: s.Allocation.Descriptor.RID,
		NodeLifecycleGeneration: s.Allocation.DescriptorLifecycleGeneration, StableType: s.Allocation.StableType,
		Capacity: viewCapacity(s.Allocation.Capacity), Payload: viewPayload(s.Payload),
	}
	if ok, err := authority.DecodeKey(key); err == nil {
		v.ObjectKind, v.GlobalID = string(ok.Kind), ok.GlobalID
	} else {
		v.ObjectKind = string(s.Allocation.ObjectKind)
	}
	if p := s.PendingCreation; p != nil {
		v.PendingCreation = &pendingView{ReservationID: p.ReservationID, RequestContentReference: p.RequestContentReference,
			RequestSHA256: hex.EncodeToString(p.RequestSHA256), RequestEncodedSize: p.RequestEncodedSize}
	}
	return v
}

var rowHeader = []string{"KEY", "STATE", "OWNER", "TOKEN", "NODE", "VERSION", "PAYLOAD"}
var rowWide = []string{"OBJECT-GEN", "OWNER-GEN", "STABLE-TYPE", "CAPACITY", "RESERVATION"}

func rowTable() *table { return &table{header: rowHeader, wide: rowWide} }

func (t *table) addRow(v rowView) {
	reservation := ""
	if v.PendingCreation != nil {
		reservation = v.PendingCreation.ReservationID
	}
	t.add(v.Key, v.State, fmt.Sprintf("%s/%d", v.OwnerID, v.OwnerLeaseGeneration), strconv.FormatInt(v.OwnershipToken, 10),
		fmt.Sprintf("%s/%s@%d", v.MeshName, v.NodeRID, v.NodeLifecycleGeneration), v.StoreVersion, v.Payload.String(),
		strconv.FormatInt(v.ObjectGeneration, 10), strconv.FormatInt(v.AuthorityOwnerGeneration, 10),
		orDash(v.StableType), v.Capacity.String(), orDash(reservation))
}

// validKinds are the object kinds get accepts.
var validKinds = []authority.ObjectKind{authority.ObjectActor, authority.ObjectUserSpot, authority.ObjectInstanceSpot}

// parseKind resolves a kind argument ("user_spot", "user-spot", "userspot").
func parseKind(s string) (authority.ObjectKind, error) {
	norm := strings.ToLower(strings.ReplaceAll(s, "-", "_"))
	for _, k := range validKinds {
		if norm == string(k) || norm == strings.ReplaceAll(string(k), "_", "") {
			return k, nil
		}
	}
	names := make([]string, len(validKinds))
	for i, k := range validKinds {
		names[i] = string(k)
	}
	return "", usageError(fmt.Errorf("unknown kind %q: valid kinds are %s", s, strings.Join(names, ", ")))
}
