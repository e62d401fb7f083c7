package coordinator

// Reading an Instance Spot's authority row: Ready (its route), being
// activated, or missing.

import (
	"context"

	authority "github.com/zlink-systems/authority"
)

// RouteFence is the route of a Ready Instance Spot generation.
type RouteFence struct {
	TargetNodeRID            string
	TargetNodeGeneration     int64
	TargetSpotID             string
	ObjectGeneration         int64
	OwnerID                  string
	AuthorityOwnerGeneration int64
	LeaseGeneration          int64
	StoreVersion             authority.StoreVersion
	// OwnershipToken is the Ready row's fencing token
	// (authority.Snapshot.OwnershipToken): the activated Spot's code sends
	// it with its writes to other systems (package fencing).
	OwnershipToken int64
}

// ReadKind is the outcome of InstanceActivationAuthority.Read.
type ReadKind string

// Read outcomes.
const (
	ReadMissing  ReadKind = "missing"
	ReadCreating ReadKind = "creating"
	ReadReady    ReadKind = "ready"
)

// AuthorityRead is what Read found.
type AuthorityRead struct {
	Kind ReadKind
	// ObjectGeneration and AuthorityOwnerGeneration are set for ReadCreating.
	ObjectGeneration         int64
	AuthorityOwnerGeneration int64
	// Route is set for ReadReady.
	Route RouteFence
}

// Read reports whether the target is Ready, being activated on the target
// node, or missing (anything else reads as missing).
func (a *InstanceActivationAuthority) Read(ctx context.Context, target ActivationTarget) (AuthorityRead, error) {
	_, cur, err := readSpot(ctx, a.rows(), authority.ObjectInstanceSpot, target.TargetSpotID)
	if err != nil {
		return AuthorityRead{}, err
	}
	if cur.Kind != authority.KindSnapshot {
		return AuthorityRead{Kind: ReadMissing}, nil
	}
	return readyRead(cur.Snapshot, target), nil
}

// readyRead classifies an Instance row for Read.
func readyRead(s *authority.Snapshot, target ActivationTarget) AuthorityRead {
	alloc := s.Allocation
	if p, err := DecodeInstancePayload(s.Payload); err == nil && p.State == StateColdActivating &&
		alloc.ObjectKind == authority.ObjectInstanceSpot &&
		alloc.State == authority.AllocationReserved &&
		p.StableType == target.StableType && p.SpotID == target.TargetSpotID &&
		p.OwnerID == s.OwnerID && p.OwnerLeaseGeneration == s.OwnerLeaseGeneration &&
		p.OwnerMeshName == alloc.Descriptor.MeshName &&
		p.OwnerNodeGeneration == alloc.DescriptorLifecycleGeneration &&
		p.OwnerNodeRID == alloc.Descriptor.RID &&
		target.TargetNodeRID == alloc.Descriptor.RID &&
		target.TargetNodeGeneration == alloc.DescriptorLifecycleGeneration {
		return AuthorityRead{Kind: ReadCreating, ObjectGeneration: s.ObjectGeneration, AuthorityOwnerGeneration: s.AuthorityOwnerGeneration}
	}
	if !matchingReady(s, target) ||
		target.TargetNodeRID != alloc.Descriptor.RID ||
		target.TargetNodeGeneration != alloc.DescriptorLifecycleGeneration {
		return AuthorityRead{Kind: ReadMissing}
	}
	route, err := routeFromSnapshot(s)
	if err != nil {
		return AuthorityRead{Kind: ReadMissing}
	}
	return AuthorityRead{Kind: ReadReady, Route: route}
}

// matchingReady reports whether s is the active Ready row of target's Spot,
// its payload agreeing with the row's owner and node.
func matchingReady(s *authority.Snapshot, target ActivationTarget) bool {
	p, ok := DecodeReadySpot(s.Payload)
	alloc := s.Allocation
	return ok && p.Kind == authority.ObjectInstanceSpot &&
		p.StableType == target.StableType && p.SpotID == target.TargetSpotID &&
		alloc.ObjectKind == authority.ObjectInstanceSpot && alloc.State == authority.AllocationActive &&
		p.OwnerID == s.OwnerID && p.OwnerLeaseGeneration == s.OwnerLeaseGeneration &&
		p.OwnerMeshName == alloc.Descriptor.MeshName &&
		p.OwnerNodeGeneration == alloc.DescriptorLifecycleGeneration &&
		p.OwnerNodeRID == alloc.Descriptor.RID
}

func readyExisting(s *authority.Snapshot, target ActivationTarget) (RouteFence, error) {
	if s == nil || !matchingReady(s, target) {
		return RouteFence{}, newError(KindRequestFailed, "Existing Instance authority is not a matching Ready allocation.", false, nil)
	}
	return routeFromSnapshot(s)
}

func routeFromSnapshot(s *authority.Snapshot) (RouteFence, error) {
	p, ok := DecodeReadySpot(s.Payload)
	if !ok || p.Kind != authority.ObjectInstanceSpot {
		return RouteFence{}, newError(KindRequestFailed, "Instance authority is not Ready.", false, nil)
	}
	return RouteFence{
		TargetNodeRID: s.Allocation.Descriptor.RID, TargetNodeGeneration: s.Allocation.DescriptorLifecycleGeneration,
		TargetSpotID: p.SpotID, ObjectGeneration: s.ObjectGeneration, OwnerID: s.OwnerID,
		AuthorityOwnerGeneration: s.AuthorityOwnerGeneration, LeaseGeneration: s.OwnerLeaseGeneration,
		StoreVersion: s.StoreVersion, OwnershipToken: s.OwnershipToken,
	}, nil
}
