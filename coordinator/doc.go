// Package coordinator holds the authority store's real users in the
// framework, ported from the framework's TypeScript runtime:
//
//   - UserSpotCoordinator (ZLinkUserSpotCreationCoordinator) creates and
//     closes User Spots. A reservation in the store is the only visibility
//     barrier: only the reservation's winner runs the application's
//     materialize, everyone else gets the existing Spot.
//   - InstanceActivationAuthority (ZLinkInstanceActivationAuthority)
//     activates Instance Spots, storing each activation's recovery envelope
//     as a relocation blob so that a restarted node can resume it.
//   - The service authority payload codec (EncodePayload, DecodePayload) and
//     the inline creation content reference (EncodeContentReference,
//     DecodeContentReference) are the byte formats the coordinators write;
//     tools decode any coordinator payload with DecodePayload.
//
// The coordinators run on any authority.Store. When the store also
// implements authority.ChangeWaiter they wait on its change feed instead of
// polling. Failures are *Error values of an ErrorKind, each usable as an
// errors.Is target.
package coordinator
