package conformance

import (
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// world is the population each bad-input case runs against: every request
// of a case is valid but for the one field the case breaks.
type world struct {
	actor      *authority.Snapshot // active Actor a1 on TargetA
	actorKey   authority.Key
	actorRes   Reservation // reserved Actor a2 on TargetA
	spotRes    Reservation // reserved user Spot s1 on TargetA
	move       authority.AggregatePrepareRequest
	lease2     authority.OwnerToken
	validFence authority.Fence
}

func newWorld(fx *Fixture) *world {
	w := &world{
		actor:    fx.Active(authority.ObjectActor, "a1", TargetA),
		actorKey: fx.Key(authority.ObjectActor, "a1"),
		actorRes: fx.Reserve(authority.ObjectActor, "a2", TargetA),
		spotRes:  fx.Reserve(authority.ObjectUserSpot, "s1", TargetA),
		lease2:   authority.OwnerToken{OwnerID: OwnerA.OwnerID, LeaseGeneration: 2},
	}
	fx.Active(authority.ObjectUserSpot, "s2", TargetA)
	fx.SetLive(Target(NodeA, NodeLifecycle, w.lease2), true)
	w.move = AggregateRequest("agg-v", 1, TargetB, authority.CapacityVector{Actors: 1},
		Participant(w.actorKey, w.actor.StoreVersion, authority.TransitionNewOwner, []byte("moved")))
	w.validFence = w.move.Fence()
	return w
}

type badInput struct {
	name string
	// msg is a part of the message the error must carry.
	msg  string
	call func(fx *Fixture, w *world) error
}

var tooBig = make([]byte, authority.MaxPayloadBytes+1)

// sharedMessages are the seed's messages that several rules share: an error
// carrying one names the rule broken beside it (its cause).
var sharedMessages = map[string]bool{
	"Placement capacity vector is invalid.":                                           true,
	"Object creation content receipt is invalid.":                                     true,
	"Authority lease rebind must retain the owner and change the lease generation.":   true,
	"Aggregate generation and participant count are invalid.":                         true,
	"Creation terminal source generation and operation ID are invalid.":               true,
	"Creation terminal envelope must not exceed 1 MiB and requires a SHA-256 digest.": true,
	"Creation terminal expiry must be the live operation deadline plus five minutes.": true,
}

// ruleOf is, for each case with a shared message, a part of the rule its
// error must name.
var ruleOf = map[string]string{
	"CASRebindOtherOwnerID":            `Target owner "owner-b" is not the expected owner`,
	"CASRebindSameLease":               "both lease generation 1",
	"CASRebindZeroExpectedLease":       "Lease generations must be at least 1 (expected 0, target 2)",
	"CASRebindNegativeTargetLease":     "Lease generations must be at least 1 (expected 1, target -1)",
	"ReserveCapacityAllZero":           "Every count is zero",
	"ReserveCapacityNegativeActors":    "Actors is -1, outside 0..2147483647",
	"ReserveCapacityNegativeSpots":     "Spots is -1, outside",
	"ReserveCapacityTooLarge":          "Spots is 2147483648, outside",
	"ReserveSpotTypeZeroCount":         "SpotType.Count is zero",
	"ReserveSpotTypeNegativeCount":     "SpotType.Count is -1, outside",
	"ReserveSpotTypeCountTooLarge":     "SpotType.Count is 2147483648, outside",
	"ReserveSpotTypeOfActorKind":       `SpotType.ObjectKind "actor" is not a Spot kind`,
	"ReserveSpotTypeOfUnknownKind":     `SpotType.ObjectKind "spot" is not a Spot kind`,
	"ReserveSpotTypeNULStableType":     "SpotType.StableType contains NUL",
	"ReserveDigestShort":               "RequestSHA256 has 31 bytes, not a SHA-256 digest's 32",
	"ReserveDigestLong":                "RequestSHA256 has 33 bytes",
	"ReserveDigestMissing":             "RequestSHA256 has 0 bytes",
	"ReserveEncodedSizeNegative":       "RequestEncodedSize is -1, outside 0..1048576",
	"ReserveEncodedSizeTooLarge":       "RequestEncodedSize is 1048577, outside",
	"CompleteSourceGenerationZero":     "SourceNodeGeneration is 0, below 1",
	"CompleteSourceGenerationNegative": "SourceNodeGeneration is -1, below 1",
	"CompleteOperationIDZero":          "OperationID is zero",
	"CompleteEnvelopeTooLarge":         "TerminalEnvelope has 1048577 bytes, over 1048576",
	"CompleteEnvelopeDigestShort":      "TerminalEnvelopeSHA256 has 16 bytes",
	"CompleteDeadlineZero":             "OperationDeadline is not set",
	"CompleteDeadlinePassed":           "not after the store's now",
	"CompleteExpiryNow":                "not after the store's now",
	"ReadTerminalSourceGenerationZero": "SourceNodeGeneration is 0, below 1",
	"ReadTerminalOperationIDZero":      "OperationID is zero",
	"PrepareGenerationZero":            "AggregateGeneration is 0, below 1",
	"PrepareNoParticipants":            "Participants is empty",
	"PrepareCapacityZero":              "Every count is zero",
	"PrepareCapacityNegative":          "Actors is -1, outside",
	"PrepareCapacityTooLarge":          "Actors is 2147483648, outside",
	"PrepareSpotTypeZeroCount":         "SpotType.Count is zero",
	"PrepareSpotTypeOfActorKind":       `SpotType.ObjectKind "actor" is not a Spot kind`,
	"PrepareSpotTypeNULStableType":     "SpotType.StableType contains NUL",
	"CommitAggregateGenerationZero":    "AggregateGeneration is 0, below 1",
	"AbortAggregateGenerationZero":     "AggregateGeneration is 0, below 1",
}

// RunTestValidation runs the bad-input table: every validation rule of the
// contract, each case required to fail with ErrInvalidArgument (and its
// message) and to leave every row and capacity counter unchanged.
func RunTestValidation(ctx context.Context, t *testing.T, f Factory) {
	var cases []badInput
	cases = append(cases, readCases()...)
	cases = append(cases, casCases()...)
	cases = append(cases, listCases()...)
	cases = append(cases, reserveCases()...)
	cases = append(cases, commitAbortCases()...)
	cases = append(cases, completionCases()...)
	cases = append(cases, aggregateCases()...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := NewFixtureContext(ctx, t, f(t))
			w := newWorld(fx)
			before := fx.State()
			err := tc.call(fx, w)
			require.Error(t, err)
			require.True(t, errors.Is(err, authority.ErrInvalidArgument), "error %v does not wrap ErrInvalidArgument", err)
			if tc.msg != "" {
				require.Contains(t, err.Error(), tc.msg)
			}
			if rule, shared := ruleOf[tc.name]; shared || sharedMessages[tc.msg] {
				require.True(t, shared, "case %s has a message several rules share: name its rule in ruleOf", tc.name)
				require.Contains(t, err.Error(), rule, "the error names the rule broken")
			}
			fx.RequireState(before)
		})
	}
}

func readCases() []badInput {
	read := func(key authority.Key) func(*Fixture, *world) error {
		return func(fx *Fixture, _ *world) error {
			_, err := fx.Store().ReadAuthority(fx.Ctx(), key)
			return err
		}
	}
	return []badInput{
		{"ReadEmptyKey", "authority key must be non-empty text without NUL.", read("")},
		{"ReadNULKey", "authority key must be non-empty text without NUL.", read("actor/a\x001")},
	}
}

func casCases() []badInput {
	cas := func(key func(*world) authority.Key, m func(*world) authority.Mutation) func(*Fixture, *world) error {
		return func(fx *Fixture, w *world) error {
			_, err := fx.Store().CompareExchangeAuthority(fx.Ctx(), key(w), w.actor.StoreVersion, m(w))
			return err
		}
	}
	row := func(w *world) authority.Key { return w.actorKey }
	put := func(m authority.Mutation) func(*world) authority.Mutation {
		return func(*world) authority.Mutation { return m }
	}
	rebind := func(exp, target authority.OwnerToken, payload []byte) func(*world) authority.Mutation {
		return func(*world) authority.Mutation { return authority.RebindOwnerLease(exp, target, payload) }
	}
	lease2 := authority.OwnerToken{OwnerID: OwnerA.OwnerID, LeaseGeneration: 2}
	const rebindMsg = "Authority lease rebind must retain the owner and change the lease generation."
	return []badInput{
		{"CASEmptyKey", "authority key must be non-empty", cas(func(*world) authority.Key { return "" }, put(authority.Put(nil)))},
		{"CASNULKey", "authority key must be non-empty", cas(func(*world) authority.Key { return "actor/\x00" }, put(authority.Put(nil)))},
		{"CASPutNewOwner", "Authority owner transitions require an aggregate CAS.",
			cas(row, put(authority.Mutation{Kind: authority.MutationPut, GenerationTransition: authority.TransitionNewOwner}))},
		{"CASPutNoTransition", "Authority owner transitions require an aggregate CAS.",
			cas(row, put(authority.Mutation{Kind: authority.MutationPut}))},
		{"CASPutPayloadTooLarge", "Authority payload exceeds 1 MiB.", cas(row, put(authority.Put(tooBig)))},
		{"CASRestorePayloadTooLarge", "Authority payload exceeds 1 MiB.", cas(row, put(authority.Restore(OwnerA, tooBig)))},
		{"CASRebindPayloadTooLarge", "Authority payload exceeds 1 MiB.", cas(row, rebind(OwnerA, lease2, tooBig))},
		{"CASRebindOtherOwnerID", rebindMsg, cas(row, rebind(OwnerA, authority.OwnerToken{OwnerID: "owner-b", LeaseGeneration: 2}, nil))},
		{"CASRebindSameLease", rebindMsg, cas(row, rebind(OwnerA, OwnerA, nil))},
		{"CASRebindZeroExpectedLease", rebindMsg, cas(row, rebind(authority.OwnerToken{OwnerID: OwnerA.OwnerID}, lease2, nil))},
		{"CASRebindNegativeTargetLease", rebindMsg, cas(row, rebind(OwnerA, authority.OwnerToken{OwnerID: OwnerA.OwnerID, LeaseGeneration: -1}, nil))},
		{"CASUnknownMutation", "Authority mutation kind is invalid.", cas(row, put(authority.Mutation{Kind: "upsert", GenerationTransition: authority.TransitionPreserve}))},
		{"CASEmptyMutation", "Authority mutation kind is invalid.", cas(row, put(authority.Mutation{}))},
	}
}

func listCases() []badInput {
	list := func(prefix string, cursor authority.ScanCursor, limit int) func(*Fixture, *world) error {
		return func(fx *Fixture, _ *world) error {
			_, err := fx.Store().ListAuthorities(fx.Ctx(), prefix, cursor, limit)
			return err
		}
	}
	const limitMsg = "Authority scan limit must be in 1..1000."
	actors := authority.KindPrefix(authority.ObjectActor)
	return []badInput{
		{"ListLimitZero", limitMsg, list(actors, "", 0)},
		{"ListLimitNegative", limitMsg, list(actors, "", -1)},
		{"ListLimitTooLarge", limitMsg, list(actors, "", authority.MaxScanLimit+1)},
		{"ListMalformedCursor", "", list(actors, "garbage!", 1)},
		{"ListCursorOfOtherPrefix", "", func(fx *Fixture, _ *world) error {
			res, err := fx.Store().ListAuthorities(fx.Ctx(), actors, "", 1)
			if err != nil {
				return err
			}
			if res.NextCursor == "" {
				return errors.New("first page has no cursor")
			}
			_, err = fx.Store().ListAuthorities(fx.Ctx(), authority.KindPrefix(authority.ObjectUserSpot), res.NextCursor, 1)
			return err
		}},
		{"RemoveAllByOwnerEmptyOwnerID", "owner ID must be non-empty text without NUL.", func(fx *Fixture, _ *world) error {
			_, err := fx.Store().RemoveAllByOwner(fx.Ctx(), authority.OwnerToken{LeaseGeneration: 1})
			return err
		}},
		{"RemoveAllByOwnerNULOwnerID", "owner ID must be non-empty text without NUL.", func(fx *Fixture, _ *world) error {
			_, err := fx.Store().RemoveAllByOwner(fx.Ctx(), authority.OwnerToken{OwnerID: "owner-a\x00", LeaseGeneration: 1})
			return err
		}},
	}
}

func reserveCases() []badInput {
	reserve := func(mod func(*authority.ReserveRequest)) func(*Fixture, *world) error {
		return func(fx *Fixture, _ *world) error {
			req := fx.ReserveRequest(authority.ObjectUserSpot, "new", TargetA)
			mod(&req)
			_, err := fx.Store().Reserve(fx.Ctx(), req)
			return err
		}
	}
	const capMsg = "Placement capacity vector is invalid."
	const receiptMsg = "Object creation content receipt is invalid."
	const kindMsg = "Object kind must be actor, user_spot or instance_spot."
	spotType := func(mod func(*authority.SpotTypeCapacity)) func(*authority.ReserveRequest) {
		return func(r *authority.ReserveRequest) {
			st := *r.Capacity.SpotType
			mod(&st)
			r.Capacity.SpotType = &st
		}
	}
	return []badInput{
		{"ReserveEmptyKind", kindMsg, reserve(func(r *authority.ReserveRequest) { r.Key.Kind = "" })},
		{"ReserveUpperCaseKind", kindMsg, reserve(func(r *authority.ReserveRequest) { r.Key.Kind = "User_spot" })},
		{"ReserveKindWithSlash", kindMsg, reserve(func(r *authority.ReserveRequest) { r.Key.Kind = "user/spot" })},
		{"ReserveKindTooLong", kindMsg, reserve(func(r *authority.ReserveRequest) { r.Key.Kind = authority.ObjectKind(strings.Repeat("k", 65)) })},
		{"ReserveUnknownKind", kindMsg, reserve(func(r *authority.ReserveRequest) { r.Key.Kind = "user_spot_x" })},
		{"ReserveEmptyGlobalID", "object global ID must be non-empty text without NUL.", reserve(func(r *authority.ReserveRequest) { r.Key.GlobalID = "" })},
		{"ReserveNULGlobalID", "object global ID must be non-empty text without NUL.", reserve(func(r *authority.ReserveRequest) { r.Key.GlobalID = "a\x00b" })},
		{"ReserveEmptyStableType", "stable type must be non-empty text without NUL.", reserve(func(r *authority.ReserveRequest) { r.Intent.StableType = "" })},
		{"ReserveNULStableType", "stable type must be non-empty text without NUL.", reserve(func(r *authority.ReserveRequest) { r.Intent.StableType = "t\x00" })},
		{"ReserveEmptyContentReference", "creation content reference must be non-empty text without NUL.", reserve(func(r *authority.ReserveRequest) { r.Intent.RequestContentReference = "" })},
		{"ReserveNULContentReference", "creation content reference must be non-empty text without NUL.", reserve(func(r *authority.ReserveRequest) { r.Intent.RequestContentReference = "\x00" })},
		{"ReservePayloadTooLarge", "Authority payload exceeds 1 MiB.", reserve(func(r *authority.ReserveRequest) { r.CreatingPayload = tooBig })},
		{"ReserveCapacityAllZero", capMsg, reserve(func(r *authority.ReserveRequest) { r.Capacity = authority.CapacityVector{} })},
		{"ReserveCapacityNegativeActors", capMsg, reserve(func(r *authority.ReserveRequest) { r.Capacity.Actors = -1 })},
		{"ReserveCapacityNegativeSpots", capMsg, reserve(func(r *authority.ReserveRequest) { r.Capacity.Spots = -1 })},
		{"ReserveCapacityTooLarge", capMsg, reserve(func(r *authority.ReserveRequest) { r.Capacity.Spots = 1 << 31 })},
		{"ReserveSpotTypeZeroCount", capMsg, reserve(spotType(func(st *authority.SpotTypeCapacity) { st.Count = 0 }))},
		{"ReserveSpotTypeNegativeCount", capMsg, reserve(spotType(func(st *authority.SpotTypeCapacity) { st.Count = -1 }))},
		{"ReserveSpotTypeCountTooLarge", capMsg, reserve(spotType(func(st *authority.SpotTypeCapacity) { st.Count = 1 << 31 }))},
		{"ReserveSpotTypeOfActorKind", capMsg, reserve(spotType(func(st *authority.SpotTypeCapacity) { st.ObjectKind = authority.ObjectActor }))},
		{"ReserveSpotTypeOfUnknownKind", capMsg, reserve(spotType(func(st *authority.SpotTypeCapacity) { st.ObjectKind = "spot" }))},
		{"ReserveSpotTypeNULStableType", capMsg, reserve(spotType(func(st *authority.SpotTypeCapacity) { st.StableType = "a\x00" }))},
		{"ReserveDigestShort", receiptMsg, reserve(func(r *authority.ReserveRequest) { r.Intent.RequestSHA256 = r.Intent.RequestSHA256[:31] })},
		{"ReserveDigestLong", receiptMsg, reserve(func(r *authority.ReserveRequest) { r.Intent.RequestSHA256 = append(r.Intent.RequestSHA256, 0) })},
		{"ReserveDigestMissing", receiptMsg, reserve(func(r *authority.ReserveRequest) { r.Intent.RequestSHA256 = nil })},
		{"ReserveEncodedSizeNegative", receiptMsg, reserve(func(r *authority.ReserveRequest) { r.Intent.RequestEncodedSize = -1 })},
		{"ReserveEncodedSizeTooLarge", receiptMsg, reserve(func(r *authority.ReserveRequest) { r.Intent.RequestEncodedSize = authority.MaxPayloadBytes + 1 })},
	}
}

func commitAbortCases() []badInput {
	commit := func(actor bool, mod func(*authority.CommitRequest)) func(*Fixture, *world) error {
		return func(fx *Fixture, w *world) error {
			r := w.spotRes
			if actor {
				r = w.actorRes
			}
			req := r.CommitRequest([]byte("ready"))
			mod(&req)
			_, err := fx.Store().Commit(fx.Ctx(), req)
			return err
		}
	}
	abort := func(mod func(*authority.AbortRequest)) func(*Fixture, *world) error {
		return func(fx *Fixture, w *world) error {
			req := w.spotRes.AbortRequest()
			mod(&req)
			_, err := fx.Store().Abort(fx.Ctx(), req)
			return err
		}
	}
	return []badInput{
		{"CommitActor", "Actor creation must use completeCreation.", commit(true, func(*authority.CommitRequest) {})},
		{"CommitPayloadTooLarge", "Authority payload exceeds 1 MiB.", commit(false, func(r *authority.CommitRequest) { r.ReadyPayload = tooBig })},
		{"CommitEmptyGlobalID", "object global ID must be non-empty", commit(false, func(r *authority.CommitRequest) { r.Key.GlobalID = "" })},
		{"CommitBadKind", "Object kind must be actor, user_spot or instance_spot.", commit(false, func(r *authority.CommitRequest) { r.Key.Kind = "Spot!" })},
		{"AbortEmptyGlobalID", "object global ID must be non-empty", abort(func(r *authority.AbortRequest) { r.Key.GlobalID = "" })},
		{"AbortNULGlobalID", "object global ID must be non-empty", abort(func(r *authority.AbortRequest) { r.Key.GlobalID = "\x00" })},
		{"AbortBadKind", "Object kind must be actor, user_spot or instance_spot.", abort(func(r *authority.AbortRequest) { r.Key.Kind = "" })},
	}
}

func completionCases() []badInput {
	complete := func(mod func(fx *Fixture, r *authority.CompleteCreationRequest)) func(*Fixture, *world) error {
		return func(fx *Fixture, w *world) error {
			req := w.actorRes.CompleteRequest(authority.TerminalCreated, []byte("ready"), fx.Publication())
			mod(fx, &req)
			_, err := fx.Store().CompleteCreation(fx.Ctx(), req)
			return err
		}
	}
	op := func(mod func(*authority.CreationOperation)) func(*Fixture, *world) error {
		return complete(func(_ *Fixture, r *authority.CompleteCreationRequest) { mod(&r.Completion.Terminal.Operation) })
	}
	const ridMsg = "Creation terminal source node RID must contain 1..255 UTF-8 bytes without NUL."
	const opMsg = "Creation terminal source generation and operation ID are invalid."
	const envMsg = "Creation terminal envelope must not exceed 1 MiB and requires a SHA-256 digest."
	const expiryMsg = "Creation terminal expiry must be the live operation deadline plus five minutes."
	readTerminal := func(mod func(*authority.CreationOperation)) func(*Fixture, *world) error {
		return func(fx *Fixture, _ *world) error {
			o := fx.Operation()
			mod(&o)
			_, err := fx.Store().ReadCreationTerminal(fx.Ctx(), o)
			return err
		}
	}
	return []badInput{
		{"CompleteSpot", "completeCreation is reserved for Actor creation.", func(fx *Fixture, w *world) error {
			req := w.spotRes.CompleteRequest(authority.TerminalCreated, []byte("ready"), fx.Publication())
			_, err := fx.Store().CompleteCreation(fx.Ctx(), req)
			return err
		}},
		{"CompleteUnknownKind", "Creation completion kind is invalid.", complete(func(_ *Fixture, r *authority.CompleteCreationRequest) { r.Completion.Kind = "committed" })},
		{"CompleteEmptyKind", "Creation completion kind is invalid.", complete(func(_ *Fixture, r *authority.CompleteCreationRequest) { r.Completion.Kind = "" })},
		{"CompleteCreatedPayloadTooLarge", "Authority payload exceeds 1 MiB.", complete(func(_ *Fixture, r *authority.CompleteCreationRequest) { r.Completion.ReadyPayload = tooBig })},
		{"CompleteEmptyGlobalID", "object global ID must be non-empty", complete(func(_ *Fixture, r *authority.CompleteCreationRequest) { r.Key.GlobalID = "" })},
		{"CompleteNoTerminal", "Creation completion requires a terminal publication.", complete(func(_ *Fixture, r *authority.CompleteCreationRequest) { r.Completion.Terminal = nil })},
		{"CompleteEmptySourceRID", ridMsg, op(func(o *authority.CreationOperation) { o.SourceNodeRID = "" })},
		{"CompleteSourceRIDTooLong", ridMsg, op(func(o *authority.CreationOperation) { o.SourceNodeRID = strings.Repeat("r", 256) })},
		{"CompleteSourceRIDNUL", ridMsg, op(func(o *authority.CreationOperation) { o.SourceNodeRID = "node\x00" })},
		{"CompleteSourceRIDInvalidUTF8", ridMsg, op(func(o *authority.CreationOperation) { o.SourceNodeRID = "node\xff" })},
		{"CompleteSourceGenerationZero", opMsg, op(func(o *authority.CreationOperation) { o.SourceNodeGeneration = 0 })},
		{"CompleteSourceGenerationNegative", opMsg, op(func(o *authority.CreationOperation) { o.SourceNodeGeneration = -1 })},
		{"CompleteOperationIDZero", opMsg, op(func(o *authority.CreationOperation) { o.OperationID = authority.CreationOperationID{} })},
		{"CompleteEnvelopeTooLarge", envMsg, complete(func(_ *Fixture, r *authority.CompleteCreationRequest) {
			sum := sha256.Sum256(tooBig)
			r.Completion.Terminal.TerminalEnvelope, r.Completion.Terminal.TerminalEnvelopeSHA256 = tooBig, sum[:]
		})},
		{"CompleteEnvelopeDigestShort", envMsg, complete(func(_ *Fixture, r *authority.CompleteCreationRequest) {
			r.Completion.Terminal.TerminalEnvelopeSHA256 = r.Completion.Terminal.TerminalEnvelopeSHA256[:16]
		})},
		{"CompleteEnvelopeDigestMismatch", "Creation terminal envelope SHA-256 does not match its bytes.", complete(func(_ *Fixture, r *authority.CompleteCreationRequest) {
			r.Completion.Terminal.TerminalEnvelope = append([]byte("x"), r.Completion.Terminal.TerminalEnvelope...)
		})},
		{"CompleteDeadlineZero", expiryMsg, complete(func(_ *Fixture, r *authority.CompleteCreationRequest) {
			r.Completion.Terminal.OperationDeadline = time.Time{}
		})},
		{"CompleteDeadlinePassed", expiryMsg, complete(func(fx *Fixture, r *authority.CompleteCreationRequest) {
			r.Completion.Terminal = fx.PublicationFor(r.Completion.Terminal.Operation, -authority.CreationTerminalRetention-time.Second)
		})},
		{"CompleteExpiryNow", expiryMsg, complete(func(fx *Fixture, r *authority.CompleteCreationRequest) {
			r.Completion.Terminal = fx.PublicationFor(r.Completion.Terminal.Operation, -authority.CreationTerminalRetention)
		})},
		{"CompleteEmptyReservationID", "creation reservation ID must be non-empty text without NUL.", complete(func(_ *Fixture, r *authority.CompleteCreationRequest) { r.ReservationID = "" })},
		{"ReadTerminalEmptySourceRID", ridMsg, readTerminal(func(o *authority.CreationOperation) { o.SourceNodeRID = "" })},
		{"ReadTerminalSourceRIDTooLong", ridMsg, readTerminal(func(o *authority.CreationOperation) { o.SourceNodeRID = strings.Repeat("r", 256) })},
		{"ReadTerminalSourceGenerationZero", opMsg, readTerminal(func(o *authority.CreationOperation) { o.SourceNodeGeneration = 0 })},
		{"ReadTerminalOperationIDZero", opMsg, readTerminal(func(o *authority.CreationOperation) { o.OperationID = authority.CreationOperationID{} })},
	}
}

func aggregateCases() []badInput {
	prepare := func(mod func(w *world, r *authority.AggregatePrepareRequest)) func(*Fixture, *world) error {
		return func(fx *Fixture, w *world) error {
			req := w.move.Clone()
			mod(w, req)
			_, err := fx.Store().PrepareAggregate(fx.Ctx(), *req)
			return err
		}
	}
	// second adds a preserve participant for the active Spot s2 after a1.
	second := func(w *world, r *authority.AggregatePrepareRequest) authority.AggregateParticipant {
		return Participant(authority.Key("user_spot/s2"), w.actor.StoreVersion, authority.TransitionPreserve, nil)
	}
	fenced := func(commit bool, fence authority.Fence) func(*Fixture, *world) error {
		return func(fx *Fixture, w *world) error {
			fx.MustPrepare(w.move)
			var err error
			if commit {
				_, err = fx.Store().CommitAggregate(fx.Ctx(), fence)
			} else {
				_, err = fx.Store().AbortAggregate(fx.Ctx(), fence)
			}
			if err == nil {
				return nil
			}
			// Undo the valid prepare so only the bad call is judged.
			if _, abortErr := fx.Store().AbortAggregate(fx.Ctx(), w.move.Fence()); abortErr != nil {
				return abortErr
			}
			return err
		}
	}
	const countMsg = "Aggregate generation and participant count are invalid."
	const sortMsg = "Aggregate participants must be unique and canonically sorted."
	return []badInput{
		{"PrepareEmptyID", "aggregate ID must be non-empty text without NUL.", prepare(func(_ *world, r *authority.AggregatePrepareRequest) { r.AggregateID = "" })},
		{"PrepareNULID", "aggregate ID must be non-empty text without NUL.", prepare(func(_ *world, r *authority.AggregatePrepareRequest) { r.AggregateID = "agg\x00" })},
		{"PrepareGenerationZero", countMsg, prepare(func(_ *world, r *authority.AggregatePrepareRequest) { r.AggregateGeneration = 0 })},
		{"PrepareNoParticipants", countMsg, prepare(func(_ *world, r *authority.AggregatePrepareRequest) { r.Participants = nil })},
		{"PrepareDigestShort", "Aggregate inventory digest must contain 32 bytes.", prepare(func(_ *world, r *authority.AggregatePrepareRequest) { r.InventoryDigest = r.InventoryDigest[:31] })},
		{"PrepareDigestMissing", "Aggregate inventory digest must contain 32 bytes.", prepare(func(_ *world, r *authority.AggregatePrepareRequest) { r.InventoryDigest = nil })},
		{"PrepareCapacityZero", "Placement capacity vector is invalid.", prepare(func(_ *world, r *authority.AggregatePrepareRequest) { r.Capacity = authority.CapacityVector{} })},
		{"PrepareCapacityNegative", "Placement capacity vector is invalid.", prepare(func(_ *world, r *authority.AggregatePrepareRequest) { r.Capacity.Actors = -1 })},
		{"PrepareCapacityTooLarge", "Placement capacity vector is invalid.", prepare(func(_ *world, r *authority.AggregatePrepareRequest) { r.Capacity.Actors = 1 << 31 })},
		{"PrepareSpotTypeZeroCount", "Placement capacity vector is invalid.", prepare(func(_ *world, r *authority.AggregatePrepareRequest) {
			r.Capacity.SpotType = &authority.SpotTypeCapacity{ObjectKind: authority.ObjectUserSpot, StableType: DefaultStableType}
		})},
		{"PrepareSpotTypeOfActorKind", "Placement capacity vector is invalid.", prepare(func(_ *world, r *authority.AggregatePrepareRequest) {
			r.Capacity.SpotType = &authority.SpotTypeCapacity{ObjectKind: authority.ObjectActor, StableType: DefaultStableType, Count: 1}
		})},
		{"PrepareSpotTypeNULStableType", "Placement capacity vector is invalid.", prepare(func(_ *world, r *authority.AggregatePrepareRequest) {
			r.Capacity.SpotType = &authority.SpotTypeCapacity{ObjectKind: authority.ObjectUserSpot, StableType: "a\x00", Count: 1}
		})},
		{"PrepareParticipantsUnsorted", sortMsg, prepare(func(w *world, r *authority.AggregatePrepareRequest) {
			r.Participants = []authority.AggregateParticipant{second(w, r), r.Participants[0]}
		})},
		{"PrepareParticipantsDuplicate", sortMsg, prepare(func(_ *world, r *authority.AggregatePrepareRequest) {
			r.Participants = append(r.Participants, r.Participants[0])
		})},
		{"PrepareParticipantEmptyKey", "authority key must be non-empty text without NUL.", prepare(func(_ *world, r *authority.AggregatePrepareRequest) { r.Participants[0].AuthorityKey = "" })},
		{"PrepareParticipantBadTransition", "Aggregate participant owner transition must be preserve or newOwner.", prepare(func(_ *world, r *authority.AggregatePrepareRequest) {
			r.Participants[0].OwnerTransition = "steal"
		})},
		{"PrepareParticipantNoTransition", "Aggregate participant owner transition must be preserve or newOwner.", prepare(func(_ *world, r *authority.AggregatePrepareRequest) {
			r.Participants[0].OwnerTransition = ""
		})},
		{"PrepareParticipantPayloadTooLarge", "Authority payload exceeds 1 MiB.", prepare(func(_ *world, r *authority.AggregatePrepareRequest) {
			r.Participants[0].AuthorityPayload = tooBig
		})},
		{"CommitAggregateEmptyID", "aggregate ID must be non-empty text without NUL.", fenced(true, authority.Fence{AggregateGeneration: 1})},
		{"CommitAggregateGenerationZero", countMsg, fenced(true, authority.Fence{AggregateID: "agg-v"})},
		{"AbortAggregateEmptyID", "aggregate ID must be non-empty text without NUL.", fenced(false, authority.Fence{AggregateGeneration: 1})},
		{"AbortAggregateGenerationZero", countMsg, fenced(false, authority.Fence{AggregateID: "agg-v"})},
	}
}
