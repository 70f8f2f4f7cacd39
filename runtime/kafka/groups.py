"""Kafka consumer groups, the classic eager protocol, as a pure state machine (Kafka's
GroupMetadata and the membership half of its GroupCoordinator). No Ray, no asyncio, no I/O and no
clock: every call takes ``now`` (seconds, monotonic) from the caller.

One group moves through Kafka's states, each transition checked against the states it may come
from (``VALID_PREVIOUS``, as ``GroupState.validPreviousStates`` in Kafka):

* Empty: no members (a group here is dropped once Empty: its committed offsets are not kept
  here but in raytxn subscriptions, so an Empty group holds nothing; dropping it goes via Dead).
* PreparingRebalance: a member joined, left, expired or changed its protocols; every member must
  send JoinGroup again. The join completes once all have (or the rebalance timeout passed: those
  that did not are removed), giving the next generation.
* CompletingRebalance: the generation's JoinGroup answers are out; the leader (whose answer lists
  every member's protocol metadata) computes the assignment on its side and sends it in its
  SyncGroup, which moves the group to Stable and answers every member's SyncGroup.
* Stable: members heartbeat; a join of a new member, a leave or an expiry starts a rebalance, and
  heartbeats answer REBALANCE_IN_PROGRESS until each member joined again.
* Dead: dropped.

JoinGroup and SyncGroup answers are not always ready when the call is made: a call returns its
answer or None, and answers become ready in ``answers`` (taken by ``GroupTable.take_answers``),
keyed by member, for the caller that waits on them. A member has at most one waiting call of each
kind: a newer one replaces the older, so callers expire the group and hand out what time made due
(``GroupTable.expire``) before a member's new call waits. A member waiting in JoinGroup or SyncGroup is
not expired (as in Kafka); every other member is once ``session_timeout_ms`` passed since it was
last heard from. ``GroupTable.tick`` expires members and completes joins whose rebalance timeout
passed.

Everything here is volatile: a gateway that restarts forgets its groups, and members learn it
from UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION and join again. Bounds: groups, members per group,
members in all, and the bytes of a member's protocol metadata and of its assignment.

Static membership (KIP-345, ``group.instance.id``): a member may name an instance id, which the
group maps to its member id. A JoinGroup of a known instance without a member id (the consumer
restarted within its session timeout) takes the old member's place under a new member id, with
its assignment: in a Stable group whose protocol stays the same this is answered at once and
nothing rebalances (the answer names the old leader, so a replaced leader does not assign);
otherwise the group rebalances. The old member id is fenced from then on: any call naming the
instance with another member id gets FENCED_INSTANCE_ID. A static member leaves as any other
(LeaveGroup, or its session expiring), and LeaveGroup may name it by instance id alone.

Initial rebalance delay (KIP-134, Kafka's ``group.initial.rebalance.delay.ms``): the first
rebalance of an Empty group does not complete as soon as everyone known joined, but waits
``initial_delay_ms``, so that consumers started together land in one generation instead of one
rebalance each. If a new member joined meanwhile the wait is extended by the delay again, never
past the longest rebalance timeout of the members (Kafka's ``InitialDelayedJoin``).

Not served: KIP-394's MEMBER_ID_REQUIRED round trip (a new member gets its id in its first
JoinGroup answer, which every client accepts).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field

from raytxn.errors import GroupStateError, InvalidArgument

# Kafka error codes answered here (Kafka's ``Errors``).
NONE = 0
COORDINATOR_NOT_AVAILABLE = 15
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
INVALID_REQUEST = 42
GROUP_MAX_SIZE_REACHED = 81
FENCED_INSTANCE_ID = 82

MIN_SESSION_TIMEOUT_MS = 1_000
MAX_SESSION_TIMEOUT_MS = 1_800_000  # Kafka's group.max.session.timeout.ms default (30 min)
MAX_GROUPS = 1_000
MAX_MEMBERS_PER_GROUP = 500
MAX_MEMBERS = 5_000
MAX_PROTOCOLS = 16
MAX_METADATA_BYTES = 32 << 10  # a member's protocol metadata, all protocols together
MAX_ASSIGNMENT_BYTES = 32 << 10
INITIAL_REBALANCE_DELAY_MS = 3_000  # Kafka's group.initial.rebalance.delay.ms default
MAX_INITIAL_REBALANCE_DELAY_MS = 300_000  # Kafka's default max.poll.interval.ms, the usual rebalance timeout


class GroupState(enum.StrEnum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_S = GroupState
VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    _S.PREPARING_REBALANCE: frozenset({_S.STABLE, _S.COMPLETING_REBALANCE, _S.EMPTY}),
    _S.COMPLETING_REBALANCE: frozenset({_S.PREPARING_REBALANCE}),
    _S.STABLE: frozenset({_S.COMPLETING_REBALANCE}),
    _S.EMPTY: frozenset({_S.PREPARING_REBALANCE}),
    _S.DEAD: frozenset({_S.STABLE, _S.PREPARING_REBALANCE, _S.COMPLETING_REBALANCE, _S.EMPTY, _S.DEAD}),
}

Protocols = tuple[tuple[str, bytes], ...]  # (name, metadata), in the member's order of preference


@dataclass(frozen=True)
class JoinAnswer:
    """A JoinGroup answer; ``members`` (member id, metadata of the chosen protocol) for the
    leader only."""

    error: int
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: tuple[tuple[str, bytes], ...] = ()
    instances: tuple[str | None, ...] = ()  # the instance id of each of ``members`` (None: dynamic)


@dataclass(frozen=True)
class SyncAnswer:
    error: int
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True)
class Answer:
    """An answer that became ready for a member's waiting JoinGroup (``kind`` "join") or
    SyncGroup ("sync")."""

    group_id: str
    kind: str
    member_id: str
    answer: JoinAnswer | SyncAnswer


@dataclass
class Member:
    member_id: str
    client_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: Protocols
    last_heard: float
    awaiting_join: bool = False
    awaiting_sync: bool = False
    assignment: bytes = b""
    instance_id: str | None = None  # static membership's group.instance.id
    client_host: str = ""           # where its connection comes from ("/address", as Kafka shows it)

    def expired(self, now: float) -> bool:
        waiting = self.awaiting_join or self.awaiting_sync
        return not waiting and now - self.last_heard > self.session_timeout_ms / 1000


def check_join(session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
               protocols: Protocols) -> int:
    """The error a JoinGroup's own fields earn (NONE: none)."""
    if not MIN_SESSION_TIMEOUT_MS <= session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
        return INVALID_SESSION_TIMEOUT
    if not 0 < rebalance_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
        return INVALID_REQUEST
    if not protocol_type or not protocols:
        return INCONSISTENT_GROUP_PROTOCOL
    if len(protocols) > MAX_PROTOCOLS or sum(len(m) for _, m in protocols) > MAX_METADATA_BYTES:
        return INVALID_REQUEST
    return NONE


_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


def check_initial_delay(delay_ms: object) -> None:
    if type(delay_ms) is not int or not 0 <= delay_ms <= MAX_INITIAL_REBALANCE_DELAY_MS:
        raise InvalidArgument(f"initial_rebalance_delay_ms must be an int in 0..{MAX_INITIAL_REBALANCE_DELAY_MS}, "
                              f"got {delay_ms!r}")


def subscription_topics(metadata: bytes) -> list[str] | None:
    """The topics a consumer-protocol member's metadata subscribes to (Kafka's
    ConsumerProtocolSubscription: an int16 version, then an array of int16-length topic names,
    then fields this does not need); None when ``metadata`` is not one."""
    try:
        (version,) = _INT16.unpack_from(metadata, 0)
        (count,) = _INT32.unpack_from(metadata, 2)
        if version < 0 or not 0 <= count <= len(metadata):
            return None
        topics, at = [], 6
        for _ in range(count):
            (size,) = _INT16.unpack_from(metadata, at)
            if size < 0 or at + 2 + size > len(metadata):
                return None
            topics.append(metadata[at + 2:at + 2 + size].decode("utf-8"))
            at += 2 + size
        return topics
    except (struct.error, UnicodeDecodeError):
        return None


@dataclass
class Group:
    """One group's membership and generation (see the module docstring)."""

    group_id: str
    max_members: int = MAX_MEMBERS_PER_GROUP
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)  # in the order they joined
    rebalance_deadline: float | None = None
    answers: list[Answer] = field(default_factory=list)
    instances: dict[str, str] = field(default_factory=dict)  # instance id -> member id, static members
    initial_delay_ms: int = 0
    # The first rebalance out of Empty: (when its wait ends, seconds left to extend it by), and
    # whether a new member joined during the current wait (then it is extended once it ends).
    initial_join: tuple[float, float] | None = None
    new_member_added: bool = False

    def consumed_topics(self) -> set[str] | None:
        """The topics this group's members subscribe to (Kafka's ``subscribedTopics``), from every
        consumer-protocol metadata they joined with; None when one cannot be read (then every
        topic counts as consumed, Kafka's rule)."""
        topics: set[str] = set()
        for member in self.members.values():
            for _, metadata in member.protocols:
                named = subscription_topics(metadata)
                if named is None:
                    return None
                topics.update(named)
        return topics

    def transition(self, target: GroupState) -> None:
        if self.state not in VALID_PREVIOUS[target]:
            raise GroupStateError(f"group {self.group_id!r}: {self.state} -> {target} is not a transition "
                                  f"(allowed from {sorted(VALID_PREVIOUS[target])})")
        self.state = target

    def check_invariants(self) -> None:
        """Every static member is in ``instances`` under its own instance id, and nothing else
        is; the leader is a member (or none is, in an Empty group)."""
        static = {m.instance_id: m.member_id for m in self.members.values() if m.instance_id is not None}
        assert static == self.instances, f"group {self.group_id!r}: instances {self.instances} vs members {static}"
        assert self.leader is None or self.leader in self.members, f"group {self.group_id!r}: leader {self.leader}"

    def fenced(self, member_id: str, instance_id: str | None) -> int:
        """The error a call naming ``instance_id`` earns unless ``member_id`` holds it: NONE for
        none named, UNKNOWN_MEMBER_ID for an instance not here, FENCED_INSTANCE_ID for another's."""
        if instance_id is None:
            return NONE
        holder = self.instances.get(instance_id)
        if holder is None:
            return UNKNOWN_MEMBER_ID
        return NONE if holder == member_id else FENCED_INSTANCE_ID

    # --- queries ---------------------------------------------------------------------------

    def common_protocols(self) -> set[str]:
        """The protocols every member supports."""
        names: set[str] | None = None
        for member in self.members.values():
            own = {name for name, _ in member.protocols}
            names = own if names is None else names & own
        return names or set()

    def _accepts(self, protocol_type: str, protocols: Protocols) -> bool:
        if not self.members:
            return True
        return protocol_type == self.protocol_type and bool(self.common_protocols() & {n for n, _ in protocols})

    def _select_protocol(self) -> str:
        """Each member votes for its most preferred common protocol; most votes wins (ties: the
        name, so the choice does not depend on dict order)."""
        common = self.common_protocols()
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = next(name for name, _ in member.protocols if name in common)
            votes[choice] = votes.get(choice, 0) + 1
        return min(votes, key=lambda name: (-votes[name], name))

    def _join_answer(self, member: Member) -> JoinAnswer:
        members: tuple[tuple[str, bytes], ...] = ()
        if member.member_id == self.leader and self.protocol is not None:
            members = tuple((m.member_id, dict(m.protocols)[self.protocol]) for m in self.members.values())
        instances = tuple(m.instance_id for m in self.members.values()) if members else ()
        return JoinAnswer(NONE, member.member_id, self.generation, self.protocol_type, self.protocol,
                          self.leader or "", members, instances)

    # --- JoinGroup -------------------------------------------------------------------------

    def join(self, member_id: str, new_member_id: str, client_id: str, protocol_type: str, protocols: Protocols,
             session_timeout_ms: int, rebalance_timeout_ms: int, now: float, room: bool = True,
             instance_id: str | None = None, client_host: str = "") -> JoinAnswer | None:
        """A JoinGroup: its answer now, or None when the answer comes in ``answers`` once the
        join completes. ``member_id`` "" for a new member, which gets ``new_member_id``;
        ``room``: whether the gateway has room for one more member; ``instance_id``: a static
        member's (see the module docstring)."""
        self.expire(now)
        error = check_join(session_timeout_ms, rebalance_timeout_ms, protocol_type, protocols)
        if error == NONE and not self._accepts(protocol_type, protocols):
            error = INCONSISTENT_GROUP_PROTOCOL
        if error != NONE:
            return JoinAnswer(error, member_id)
        if self.state is GroupState.DEAD:
            return JoinAnswer(COORDINATOR_NOT_AVAILABLE, member_id)
        holder = self.instances.get(instance_id) if instance_id is not None else None
        if holder is not None and member_id and member_id != holder:
            return JoinAnswer(FENCED_INSTANCE_ID, member_id)
        if holder is not None and not member_id:
            replacing = Member(new_member_id, client_id, session_timeout_ms, rebalance_timeout_ms, protocols, now,
                               instance_id=instance_id, client_host=client_host)
            return self._replace_static(self.members[holder], replacing, now)
        if not member_id:
            if len(self.members) >= self.max_members or not room:
                return JoinAnswer(GROUP_MAX_SIZE_REACHED)
            member = Member(new_member_id, client_id, session_timeout_ms, rebalance_timeout_ms, protocols, now,
                            awaiting_join=True, instance_id=instance_id, client_host=client_host)
            self.members[new_member_id] = member
            if instance_id is not None:
                self.instances[instance_id] = new_member_id
            if self.protocol_type is None:
                self.protocol_type = protocol_type
            if self.leader is None:
                self.leader = new_member_id
            if self.state is GroupState.PREPARING_REBALANCE:
                self.new_member_added = True
            self._prepare_rebalance(now)
            self._maybe_complete_join(now)
            return None
        member = self.members.get(member_id)
        if member is None or member.instance_id != instance_id:
            return JoinAnswer(UNKNOWN_MEMBER_ID, member_id)
        changed = member.protocols != protocols
        member.protocols, member.last_heard = protocols, now
        member.session_timeout_ms, member.rebalance_timeout_ms = session_timeout_ms, rebalance_timeout_ms
        if self.state is GroupState.COMPLETING_REBALANCE and not changed:
            return self._join_answer(member)  # its answer was lost: the same again
        if self.state is GroupState.STABLE and not changed and member_id != self.leader:
            return self._join_answer(member)  # a follower rejoining changes nothing (Kafka)
        if self.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(now)
        member.awaiting_join = True
        self._maybe_complete_join(now)
        return None

    def _replace_static(self, old: Member, new: Member, now: float) -> JoinAnswer | None:
        """A known instance joined without a member id: ``new`` takes ``old``'s place (and its
        assignment), and ``old``'s waiting calls are answered FENCED_INSTANCE_ID (Kafka's
        ``updateStaticMemberAndRebalance``)."""
        assert old.instance_id is not None and old.instance_id == new.instance_id
        old_leader = self.leader
        if old.awaiting_join:
            self.answers.append(Answer(self.group_id, "join", old.member_id,
                                       JoinAnswer(FENCED_INSTANCE_ID, old.member_id)))
        if old.awaiting_sync:
            self.answers.append(Answer(self.group_id, "sync", old.member_id, SyncAnswer(FENCED_INSTANCE_ID)))
        new.assignment = old.assignment
        self.members = {new.member_id if m is old else m.member_id: new if m is old else m
                        for m in self.members.values()}
        self.instances[old.instance_id] = new.member_id
        if self.leader == old.member_id:
            self.leader = new.member_id
        # JoinGroup checked that the new protocols share one with every member's.
        unchanged = self.protocol in dict(new.protocols) and self._select_protocol() == self.protocol
        if self.state is GroupState.STABLE and unchanged:
            # The old leader's id, not the new one: the replaced member must not assign, since a
            # Stable group would not pass a new assignment on (Kafka answers the same).
            return JoinAnswer(NONE, new.member_id, self.generation, self.protocol_type, self.protocol,
                              old_leader or "", ())
        new.awaiting_join = True
        self._prepare_rebalance(now)
        self._maybe_complete_join(now)
        return None

    def _prepare_rebalance(self, now: float) -> None:
        if self.state is GroupState.PREPARING_REBALANCE:
            return
        if self.state is GroupState.COMPLETING_REBALANCE:
            for member in self.members.values():  # the assignment under way will not come
                self._answer_sync(member, SyncAnswer(REBALANCE_IN_PROGRESS))
        longest = max((m.rebalance_timeout_ms for m in self.members.values()), default=0)
        if self.state is GroupState.EMPTY and self.initial_delay_ms > 0:
            delay_ms = min(self.initial_delay_ms, longest)
            self.initial_join, self.new_member_added = (now + delay_ms / 1000, (longest - delay_ms) / 1000), False
        self.transition(GroupState.PREPARING_REBALANCE)
        self.rebalance_deadline = now + longest / 1000

    def _maybe_complete_join(self, now: float) -> None:
        if self.state is not GroupState.PREPARING_REBALANCE:
            return
        if self.initial_join is not None:
            self._maybe_end_initial_join(now)
            return
        everyone = all(m.awaiting_join for m in self.members.values())
        if everyone or (self.rebalance_deadline is not None and now >= self.rebalance_deadline):
            self._complete_join(now)

    def _maybe_end_initial_join(self, now: float) -> None:
        """The first rebalance completes once its wait ended with no new member in it, the
        rebalance timeout is used up, or every member left; a wait that saw a new member is
        extended from where it ended (so the outcome does not depend on when ticks come)."""
        assert self.initial_join is not None
        for _ in range(2):  # one extension at most is due at any ``now``: it clears new_member_added
            until, left_s = self.initial_join
            if self.members and now < until:
                return
            if self.members and self.new_member_added and left_s > 0:
                extend_s = min(self.initial_delay_ms / 1000, left_s)
                self.initial_join, self.new_member_added = (until + extend_s, left_s - extend_s), False
                continue
            self.initial_join, self.new_member_added = None, False
            self._complete_join(now)
            return

    def _complete_join(self, now: float) -> None:
        """The next generation: members that did not join again are out; everyone else gets
        its JoinGroup answer (the leader's with every member's metadata)."""
        for member in [m for m in self.members.values() if not m.awaiting_join]:
            self._remove(member, UNKNOWN_MEMBER_ID)
        self.generation += 1
        self.rebalance_deadline = None
        if not self.members:
            self.protocol = self.protocol_type = self.leader = None
            self.transition(GroupState.EMPTY)
            return
        self.protocol = self._select_protocol()
        self.transition(GroupState.COMPLETING_REBALANCE)
        for member in self.members.values():
            member.awaiting_join, member.last_heard, member.assignment = False, now, b""
            self.answers.append(Answer(self.group_id, "join", member.member_id, self._join_answer(member)))

    # --- SyncGroup -------------------------------------------------------------------------

    def sync(self, member_id: str, generation: int, protocol_type: str | None, protocol_name: str | None,
             assignments: dict[str, bytes], now: float, instance_id: str | None = None) -> SyncAnswer | None:
        """A SyncGroup: its answer now, or None when it comes in ``answers`` (a member waiting
        for the leader's assignment). ``assignments``: the leader's, else empty."""
        self.expire(now)
        if (fenced := self.fenced(member_id, instance_id)) != NONE:
            return SyncAnswer(fenced)
        member = self.members.get(member_id)
        if member is None:
            return SyncAnswer(UNKNOWN_MEMBER_ID)
        if generation != self.generation:
            return SyncAnswer(ILLEGAL_GENERATION)
        if (protocol_type is not None and protocol_type != self.protocol_type) or (
                protocol_name is not None and protocol_name != self.protocol):
            return SyncAnswer(INCONSISTENT_GROUP_PROTOCOL)
        if any(len(a) > MAX_ASSIGNMENT_BYTES for a in assignments.values()):
            return SyncAnswer(INVALID_REQUEST)
        member.last_heard = now
        if self.state is GroupState.PREPARING_REBALANCE:
            return SyncAnswer(REBALANCE_IN_PROGRESS)
        if self.state is GroupState.STABLE:
            return SyncAnswer(NONE, self.protocol_type, self.protocol, member.assignment)
        member.awaiting_sync = True
        if member_id == self.leader:
            for other in self.members.values():  # members the leader left out get nothing
                other.assignment = assignments.get(other.member_id, b"")
            self.transition(GroupState.STABLE)
            for other in self.members.values():
                self._answer_sync(other, SyncAnswer(NONE, self.protocol_type, self.protocol, other.assignment))
        return None

    def _answer_sync(self, member: Member, answer: SyncAnswer) -> None:
        if member.awaiting_sync:
            member.awaiting_sync = False
            self.answers.append(Answer(self.group_id, "sync", member.member_id, answer))

    # --- Heartbeat, LeaveGroup, expiry -----------------------------------------------------

    def heartbeat(self, member_id: str, generation: int, now: float, instance_id: str | None = None) -> int:
        self.expire(now)
        error = self.fenced(member_id, instance_id) or self._hear_from(member_id, generation, now)
        if error != NONE:
            return error
        return REBALANCE_IN_PROGRESS if self.state is GroupState.PREPARING_REBALANCE else NONE

    def _hear_from(self, member_id: str, generation: int, now: float) -> int:
        """A call from a member of this generation: it counts as hearing from it (NONE), else
        UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION."""
        member = self.members.get(member_id)
        if member is None:
            return UNKNOWN_MEMBER_ID
        if generation != self.generation:
            return ILLEGAL_GENERATION
        member.last_heard = now
        return NONE

    def leave(self, member_id: str, now: float, instance_id: str | None = None) -> int:
        """A member leaves; a static one may be named by its instance id alone (member id "")."""
        if instance_id is not None and not member_id:
            member_id = self.instances.get(instance_id, "")
        if (fenced := self.fenced(member_id, instance_id)) != NONE:
            return fenced
        member = self.members.get(member_id)
        if member is None:
            return UNKNOWN_MEMBER_ID
        self._remove(member, UNKNOWN_MEMBER_ID)
        self._after_removal(now)
        return NONE

    def expire(self, now: float) -> None:
        """Remove members not heard from within their session timeout; complete a join whose
        rebalance timeout passed."""
        expired = [m for m in self.members.values() if m.expired(now)]
        for member in expired:
            self._remove(member, UNKNOWN_MEMBER_ID)
        if expired:
            self._after_removal(now)
        self._maybe_complete_join(now)

    def _remove(self, member: Member, error: int) -> None:
        """Take a member out, answering a JoinGroup or SyncGroup it waits in."""
        if member.awaiting_join:
            self.answers.append(Answer(self.group_id, "join", member.member_id, JoinAnswer(error, member.member_id)))
        if member.awaiting_sync:
            self.answers.append(Answer(self.group_id, "sync", member.member_id, SyncAnswer(error)))
        del self.members[member.member_id]
        if member.instance_id is not None and self.instances.get(member.instance_id) == member.member_id:
            del self.instances[member.instance_id]
        if self.leader == member.member_id:
            self.leader = next(iter(self.members), None)

    def _after_removal(self, now: float) -> None:
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(now)
        self._maybe_complete_join(now)

    def abandon(self, kind: str, member_id: str) -> None:
        """The member's waiting JoinGroup ("join") or SyncGroup ("sync") was answered without
        the table (it waited past its bound): it waits no more, so it may expire, and a join
        completing without it leaves it out."""
        member = self.members.get(member_id)
        if member is not None:
            if kind == "join":
                member.awaiting_join = False
            else:
                member.awaiting_sync = False

    # --- offset commits --------------------------------------------------------------------

    def check_commit(self, member_id: str, generation: int, now: float, instance_id: str | None = None) -> int:
        """Whether an OffsetCommit under (member, generation) may commit (Kafka's rules; a
        generation below 0 is a consumer outside group management, allowed while the group is
        Empty). A member's commit counts as hearing from it."""
        self.expire(now)
        if generation < 0 and self.state is GroupState.EMPTY:
            return NONE
        if (fenced := self.fenced(member_id, instance_id)) != NONE:
            return fenced
        if self.state is GroupState.COMPLETING_REBALANCE:
            return REBALANCE_IN_PROGRESS
        return self._hear_from(member_id, generation, now)

    def check_txn_commit(self, member_id: str, generation: int, now: float, instance_id: str | None = None) -> int:
        """Whether a TxnOffsetCommit may commit (KIP-447): a member id, when given, must be a
        member (holding ``instance_id``, when given); a generation, when given (>= 0), the
        current one."""
        self.expire(now)
        if member_id and (fenced := self.fenced(member_id, instance_id)) != NONE:
            return fenced
        if member_id and member_id not in self.members:
            return UNKNOWN_MEMBER_ID
        if generation >= 0 and generation != self.generation:
            return ILLEGAL_GENERATION
        return NONE


class GroupTable:
    """Every group of a gateway, bounded: Empty groups are dropped (via Dead), at most
    ``max_groups`` others and ``max_members`` members in all."""

    def __init__(self, max_groups: int = MAX_GROUPS, max_members: int = MAX_MEMBERS,
                 max_members_per_group: int = MAX_MEMBERS_PER_GROUP, initial_rebalance_delay_ms: int = 0) -> None:
        """``initial_rebalance_delay_ms``: see the module docstring (0: none, as Kafka's own
        tests set it; the gateway defaults to Kafka's 3 s)."""
        check_initial_delay(initial_rebalance_delay_ms)
        self.max_groups, self.max_members, self.max_members_per_group = max_groups, max_members, max_members_per_group
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.groups: dict[str, Group] = {}
        self._answers: list[Answer] = []
        # A group dropped and created again goes on from the highest generation any dropped group
        # reached, so a generation is never handed out twice for one group id.
        self._generation_floor = 0

    def member_count(self) -> int:
        return sum(len(g.members) for g in self.groups.values())

    def join(self, group_id: str, member_id: str, new_member_id: str, client_id: str, protocol_type: str,
             protocols: Protocols, session_timeout_ms: int, rebalance_timeout_ms: int,
             now: float, instance_id: str | None = None, client_host: str = "") -> JoinAnswer | None:
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                return JoinAnswer(UNKNOWN_MEMBER_ID, member_id)
            if len(self.groups) >= self.max_groups:
                return JoinAnswer(COORDINATOR_NOT_AVAILABLE)  # retriable: room comes as groups empty
            group = Group(group_id, self.max_members_per_group, generation=self._generation_floor,
                          initial_delay_ms=self.initial_rebalance_delay_ms)
        room = self.member_count() < self.max_members
        answer = group.join(member_id, new_member_id, client_id, protocol_type, protocols, session_timeout_ms,
                            rebalance_timeout_ms, now, room, instance_id, client_host)
        if group.members or group.answers:
            self.groups[group_id] = group
        self._settle(group)
        return answer

    def sync(self, group_id: str, member_id: str, generation: int, protocol_type: str | None,
             protocol_name: str | None, assignments: dict[str, bytes], now: float,
             instance_id: str | None = None) -> SyncAnswer | None:
        group = self.groups.get(group_id)
        if group is None:
            return SyncAnswer(UNKNOWN_MEMBER_ID)
        answer = group.sync(member_id, generation, protocol_type, protocol_name, assignments, now, instance_id)
        self._settle(group)
        return answer

    def heartbeat(self, group_id: str, member_id: str, generation: int, now: float,
                  instance_id: str | None = None) -> int:
        group = self.groups.get(group_id)
        if group is None:
            return UNKNOWN_MEMBER_ID
        error = group.heartbeat(member_id, generation, now, instance_id)
        self._settle(group)
        return error

    def leave(self, group_id: str, member_ids: list[str], now: float,
              instance_ids: list[str | None] | None = None) -> list[int]:
        """One error per member id (``instance_ids``: each one's, for static members)."""
        group = self.groups.get(group_id)
        if group is None:
            return [UNKNOWN_MEMBER_ID for _ in member_ids]
        named = instance_ids if instance_ids is not None else [None] * len(member_ids)
        errors = [group.leave(member_id, now, instance) for member_id, instance in zip(member_ids, named, strict=True)]
        self._settle(group)
        return errors

    def check_commit(self, group_id: str, member_id: str, generation: int, now: float,
                     instance_id: str | None = None) -> int:
        group = self.groups.get(group_id)
        if group is None:  # Empty (dropped) or never seen: only consumers outside group management
            return NONE if generation < 0 else ILLEGAL_GENERATION
        error = group.check_commit(member_id, generation, now, instance_id)
        self._settle(group)
        return error

    def check_txn_commit(self, group_id: str, member_id: str, generation: int, now: float,
                         instance_id: str | None = None) -> int:
        group = self.groups.get(group_id)
        if group is None:
            group = Group(group_id, generation=self._generation_floor)  # Empty, as Kafka creates one here
        error = group.check_txn_commit(member_id, generation, now, instance_id)
        self._settle(group)
        return error

    def expire(self, group_id: str, now: float) -> None:
        """``Group.expire`` for one group. A caller about to make a member's JoinGroup or
        SyncGroup wait expires the group and takes the answers first: answers that time made due
        belong to calls made before (the member's earlier call among them), not to this one."""
        group = self.groups.get(group_id)
        if group is not None:
            group.expire(now)
            self._settle(group)

    def abandon(self, group_id: str, kind: str, member_id: str) -> None:
        group = self.groups.get(group_id)
        if group is not None:
            group.abandon(kind, member_id)

    def hand_off(self, group_id: str, error: int) -> None:
        """Drop a group this gateway no longer coordinates (``peers``: another gateway does now),
        answering every waiting JoinGroup and SyncGroup of its members ``error`` (NOT_COORDINATOR),
        so they find the new coordinator and join there. Its members' ids die with it: a member
        of the old coordinator is unknown to the new one, so it cannot commit there (fenced by id,
        whatever generation it holds)."""
        group = self.groups.pop(group_id, None)
        if group is None:
            return
        for member in list(group.members.values()):
            group._remove(member, error)
        self._answers.extend(group.answers)
        group.answers.clear()
        self._generation_floor = max(self._generation_floor, group.generation)

    def tick(self, now: float) -> None:
        """Expire members and complete joins whose rebalance timeout passed, in every group."""
        for group in list(self.groups.values()):
            group.expire(now)
            self._settle(group)

    def take_answers(self) -> list[Answer]:
        answers, self._answers = self._answers, []
        return answers

    def _settle(self, group: Group) -> None:
        """Collect the group's ready answers; drop it (Empty -> Dead) once it has no members."""
        group.check_invariants()
        self._answers.extend(group.answers)
        group.answers.clear()
        if group.state is GroupState.EMPTY and not group.members:
            group.transition(GroupState.DEAD)
            self.groups.pop(group.group_id, None)
            self._generation_floor = max(self._generation_floor, group.generation)
