"""The consumer-group state machine (``raytxn.kafka.groups``), driven directly: joins, the
leader's sync, rebalances on join/leave/expiry, Kafka's error codes for stale members and
generations, the bounds, and a property test of the invariants over random schedules."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytxn.errors import GroupStateError
from raytxn.kafka import groups as g
from raytxn.kafka.groups import Group, GroupState, GroupTable, JoinAnswer, SyncAnswer

PROTOCOLS = (("range", b"meta-range"), ("roundrobin", b"meta-rr"))
SESSION_MS, REBALANCE_MS = 10_000, 30_000


def join(table: GroupTable, member_id: str = "", new_id: str = "m", now: float = 0.0,
         protocols: tuple = PROTOCOLS, protocol_type: str = "consumer", group: str = "G") -> JoinAnswer | None:
    return table.join(group, member_id, new_id, "client", protocol_type, protocols, SESSION_MS, REBALANCE_MS, now)


def answers(table: GroupTable) -> dict[tuple[str, str], JoinAnswer | SyncAnswer]:
    return {(a.kind, a.member_id): a.answer for a in table.take_answers()}


def stable_pair(table: GroupTable) -> None:
    """Members a (leader) and b, Stable at generation 2."""
    assert join(table, new_id="a") is None
    first = answers(table)[("join", "a")]
    assert (first.error, first.generation, first.leader) == (g.NONE, 1, "a")
    assert table.sync("G", "a", 1, "consumer", "range", {"a": b"all"}, 0.0) is None
    assert answers(table)[("sync", "a")] == SyncAnswer(g.NONE, "consumer", "range", b"all")
    assert join(table, new_id="b", now=1.0) is None              # a rebalance: a must join again
    assert table.heartbeat("G", "a", 1, 1.5) == g.REBALANCE_IN_PROGRESS
    assert join(table, member_id="a", now=2.0) is None           # everyone joined: generation 2
    joined = answers(table)
    assert joined[("join", "a")].members == (("a", b"meta-range"), ("b", b"meta-range"))
    assert joined[("join", "b")] == JoinAnswer(g.NONE, "b", 2, "consumer", "range", "a", ())
    assert table.sync("G", "b", 2, "consumer", "range", {}, 2.1) is None  # waits for the leader
    assert answers(table) == {}
    assert table.sync("G", "a", 2, "consumer", "range", {"a": b"p0", "b": b"p1"}, 2.2) is None
    assert answers(table) == {("sync", "a"): SyncAnswer(g.NONE, "consumer", "range", b"p0"),
                              ("sync", "b"): SyncAnswer(g.NONE, "consumer", "range", b"p1")}
    assert table.groups["G"].state is GroupState.STABLE


def test_first_member_leads_and_a_second_one_rebalances() -> None:
    table = GroupTable()
    stable_pair(table)
    assert table.heartbeat("G", "b", 2, 3.0) == g.NONE
    # A follower joining again with the same protocols changes nothing: the same answer at once.
    assert join(table, member_id="b", now=3.0) == JoinAnswer(g.NONE, "b", 2, "consumer", "range", "a", ())
    assert table.groups["G"].state is GroupState.STABLE


def test_stale_members_and_generations_get_kafkas_errors() -> None:
    table = GroupTable()
    stable_pair(table)
    assert table.heartbeat("G", "nobody", 2, 3.0) == g.UNKNOWN_MEMBER_ID
    assert table.heartbeat("G", "a", 1, 3.0) == g.ILLEGAL_GENERATION
    assert table.heartbeat("other", "a", 2, 3.0) == g.UNKNOWN_MEMBER_ID
    assert table.sync("G", "b", 1, "consumer", "range", {}, 3.0) == SyncAnswer(g.ILLEGAL_GENERATION)
    assert table.sync("G", "b", 2, "consumer", "sticky", {}, 3.0) == SyncAnswer(g.INCONSISTENT_GROUP_PROTOCOL)
    assert join(table, member_id="nobody", now=3.0) == JoinAnswer(g.UNKNOWN_MEMBER_ID, "nobody")
    assert table.check_commit("G", "a", 1, 3.0) == g.ILLEGAL_GENERATION
    assert table.check_commit("G", "zzz", 2, 3.0) == g.UNKNOWN_MEMBER_ID
    assert table.check_commit("G", "", -1, 3.0) == g.UNKNOWN_MEMBER_ID   # the group is managed
    assert table.check_commit("G", "a", 2, 3.0) == g.NONE
    assert table.check_commit("H", "", -1, 3.0) == g.NONE                # no group: a plain commit
    assert table.check_commit("H", "x", 4, 3.0) == g.ILLEGAL_GENERATION
    assert table.check_txn_commit("G", "a", 2, 3.0) == g.NONE
    assert table.check_txn_commit("G", "", -1, 3.0) == g.NONE
    assert table.check_txn_commit("G", "a", 1, 3.0) == g.ILLEGAL_GENERATION
    assert table.check_txn_commit("G", "zzz", 2, 3.0) == g.UNKNOWN_MEMBER_ID
    assert table.check_txn_commit("H", "x", -1, 3.0) == g.UNKNOWN_MEMBER_ID
    assert table.groups["G"].state is GroupState.STABLE and table.groups["G"].generation == 2  # nothing changed


def test_bad_joins_change_nothing() -> None:
    table = GroupTable()
    stable_pair(table)
    before = (table.groups["G"].state, table.groups["G"].generation, list(table.groups["G"].members))
    assert join(table, new_id="c", protocol_type="connect").error == g.INCONSISTENT_GROUP_PROTOCOL
    assert join(table, new_id="c", protocols=(("sticky", b""),)).error == g.INCONSISTENT_GROUP_PROTOCOL
    assert join(table, new_id="c", protocols=()).error == g.INCONSISTENT_GROUP_PROTOCOL
    assert table.join("G", "", "c", "client", "consumer", PROTOCOLS, 10, REBALANCE_MS, 3.0).error == \
        g.INVALID_SESSION_TIMEOUT
    big = (("range", b"x" * (g.MAX_METADATA_BYTES + 1)),)
    assert join(table, new_id="c", protocols=big).error == g.INVALID_REQUEST
    assert (table.groups["G"].state, table.groups["G"].generation, list(table.groups["G"].members)) == before
    assert answers(table) == {}


def test_a_member_that_leaves_or_expires_starts_a_rebalance() -> None:
    table = GroupTable()
    stable_pair(table)
    assert table.leave("G", ["b", "nobody"], 3.0) == [g.NONE, g.UNKNOWN_MEMBER_ID]
    assert table.groups["G"].state is GroupState.PREPARING_REBALANCE
    assert table.heartbeat("G", "a", 2, 3.1) == g.REBALANCE_IN_PROGRESS
    assert join(table, member_id="a", now=3.2) is None
    assert answers(table)[("join", "a")].generation == 3
    assert table.sync("G", "a", 3, None, None, {"a": b"p0p1"}, 3.3) is None
    answers(table)
    # a is not heard from for longer than its session timeout: it is removed, the group empties.
    table.tick(3.3 + SESSION_MS / 1000 - 0.1)
    assert "G" in table.groups
    table.tick(3.3 + SESSION_MS / 1000 + 0.1)
    assert "G" not in table.groups
    assert table.heartbeat("G", "a", 3, 20.0) == g.UNKNOWN_MEMBER_ID


def test_a_member_that_does_not_join_again_is_removed_at_the_rebalance_timeout() -> None:
    table = GroupTable()
    stable_pair(table)
    assert join(table, new_id="c", now=3.0) is None      # a rebalance; a heartbeats, b is silent
    for t in (4.0, 8.0, 12.0):
        assert table.heartbeat("G", "a", 2, t) == g.REBALANCE_IN_PROGRESS
    assert join(table, member_id="a", now=12.0) is None
    assert answers(table) == {}                            # waits for b ...
    table.tick(3.0 + REBALANCE_MS / 1000 + 0.01)           # ... until the rebalance timeout
    joined = answers(table)
    assert joined[("join", "a")].generation == 3 and [m for m, _ in joined[("join", "a")].members] == ["a", "c"]
    assert "b" not in table.groups["G"].members
    assert table.heartbeat("G", "b", 2, 34.0) == g.UNKNOWN_MEMBER_ID


def test_a_waiting_follower_gets_rebalance_in_progress_when_the_leader_leaves() -> None:
    table = GroupTable()
    stable_pair(table)
    assert join(table, new_id="c", now=3.0) is None
    assert join(table, member_id="a", now=3.1) is None
    assert join(table, member_id="b", now=3.2) is None
    assert {k for k in answers(table)} == {("join", "a"), ("join", "b"), ("join", "c")}
    assert table.sync("G", "b", 3, None, None, {}, 3.3) is None
    assert table.leave("G", ["a"], 3.4) == [g.NONE]
    assert answers(table) == {("sync", "b"): SyncAnswer(g.REBALANCE_IN_PROGRESS)}
    assert table.groups["G"].leader == "b"


def test_bounds() -> None:
    table = GroupTable(max_groups=1, max_members=3, max_members_per_group=2)
    assert join(table, new_id="a") is None
    assert join(table, new_id="b") is None
    assert join(table, new_id="c").error == g.GROUP_MAX_SIZE_REACHED
    assert join(table, new_id="x", group="H").error == g.COORDINATOR_NOT_AVAILABLE
    assert len(table.groups) == 1 and len(table.groups["G"].members) == 2


def test_transitions_are_checked() -> None:
    group = Group("G")
    with pytest.raises(GroupStateError):
        group.transition(GroupState.STABLE)          # Empty -> Stable skips two states
    group.transition(GroupState.PREPARING_REBALANCE)
    with pytest.raises(GroupStateError):
        group.transition(GroupState.STABLE)
    assert group.state is GroupState.PREPARING_REBALANCE


# --- property test ---------------------------------------------------------------------------

MEMBERS = ["m0", "m1", "m2", "m3"]
operations = st.lists(st.tuples(
    st.sampled_from(["join_new", "rejoin", "sync", "heartbeat", "leave", "tick", "change", "abandon"]),
    st.sampled_from(MEMBERS), st.floats(min_value=0.0, max_value=12.0)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(operations, st.sampled_from([0, 3_000]))
def test_invariants_hold_under_any_schedule(ops: list[tuple[str, str, float]], initial_delay_ms: int) -> None:
    """Whatever members do and however time passes: transitions stay legal (no GroupStateError),
    generations only grow, a completing or stable group has a leader among its members and a
    protocol they all support, and every JoinGroup/SyncGroup left waiting gets exactly one answer
    (a removed member's too) - a waiting call is never forgotten. With and without the initial
    rebalance delay."""
    table = GroupTable(initial_rebalance_delay_ms=initial_delay_ms)
    now, last_generation = 0.0, 0
    waiting: set[tuple[str, str]] = set()
    generation_of: dict[str, int] = {}

    def take_answers() -> None:
        for answer in table.take_answers():
            key = (answer.kind, answer.member_id)
            assert key in waiting, f"an answer nobody waits for: {answer}"
            waiting.remove(key)
            if answer.kind == "join" and answer.answer.error == g.NONE:
                generation_of[answer.member_id] = answer.answer.generation

    for op, member, dt in ops:
        now += dt
        if op in ("join_new", "rejoin", "change", "sync"):  # as the gateway does before a call waits
            table.expire("G", now)
            take_answers()
        group = table.groups.get("G")
        present = group is not None and member in group.members
        if present and op in ("rejoin", "change", "sync"):
            waiting.discard(("sync" if op == "sync" else "join", member))  # the newer call replaces it
        if op == "join_new" and not present:
            if join(table, new_id=member, now=now) is None:
                waiting.add(("join", member))
        elif op in ("rejoin", "change") and present:
            protocols = PROTOCOLS if op == "rejoin" else PROTOCOLS[::-1]
            answer = join(table, member_id=member, now=now, protocols=protocols)
            if answer is None:
                waiting.add(("join", member))
        elif op == "sync" and present:
            assignments = {m: m.encode() for m in MEMBERS} if group.leader == member else {}
            if table.sync("G", member, generation_of.get(member, -1), None, None, assignments, now) is None:
                waiting.add(("sync", member))
        elif op == "heartbeat":
            table.heartbeat("G", member, generation_of.get(member, -1), now)
        elif op == "leave":
            table.leave("G", [member], now)
        elif op == "tick":
            table.tick(now)
        elif op == "abandon":  # the gateway stopped waiting for the member's answer
            for kind in ("join", "sync"):
                if (kind, member) in waiting:
                    table.abandon("G", kind, member)
                    waiting.remove((kind, member))
        take_answers()
        group = table.groups.get("G")
        if group is None:
            assert not waiting
            continue
        assert group.members, "an empty group is dropped"
        assert group.generation >= last_generation
        last_generation = group.generation
        for kind, member_id in waiting:
            flag = group.members[member_id].awaiting_join if kind == "join" else group.members[member_id].awaiting_sync
            assert flag, f"{member_id} waits in {kind} but the group does not know"
        if group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            assert group.leader in group.members
            assert group.protocol in group.common_protocols()
            assert not any(m.awaiting_join for m in group.members.values())
        if group.state is GroupState.STABLE:
            assert not any(m.awaiting_sync for m in group.members.values())
    # Nobody calls any more: a join under way completes at its rebalance timeout, then everyone's
    # session times out, and every waiting call has had its answer.
    answered = []
    for later in (1000.0, 2000.0, 3000.0):
        table.tick(now + later)
        answered += [(a.kind, a.member_id) for a in table.take_answers()]
    assert sorted(answered) == sorted(waiting)
    assert not table.groups


# --- static membership (KIP-345) -------------------------------------------------------------


def static_join(table: GroupTable, instance: str, member_id: str = "", new_id: str = "m", now: float = 0.0,
                protocols: tuple = PROTOCOLS) -> JoinAnswer | None:
    return table.join("G", member_id, new_id, "client", "consumer", protocols, SESSION_MS, REBALANCE_MS, now,
                      instance)


def static_pair(table: GroupTable) -> None:
    """Static members a (instance ia, leader) and b (ib), Stable at generation 2 with p0 / p1."""
    assert static_join(table, "ia", new_id="a") is None
    answers(table)
    assert static_join(table, "ib", new_id="b", now=1.0) is None
    assert static_join(table, "ia", member_id="a", now=1.0) is None
    joined = answers(table)
    assert joined[("join", "a")].instances == ("ia", "ib")
    table.sync("G", "b", 2, None, None, {}, 1.1, "ib")
    table.sync("G", "a", 2, None, None, {"a": b"p0", "b": b"p1"}, 1.2, "ia")
    assert answers(table)[("sync", "b")] == SyncAnswer(g.NONE, "consumer", "range", b"p1")
    assert table.groups["G"].state is GroupState.STABLE and table.groups["G"].instances == {"ia": "a", "ib": "b"}


def test_a_restarted_static_member_takes_its_place_without_a_rebalance() -> None:
    table = GroupTable()
    static_pair(table)
    # b's process restarted: it joins with its instance id and no member id.
    answer = static_join(table, "ib", new_id="b2", now=5.0)
    assert answer == JoinAnswer(g.NONE, "b2", 2, "consumer", "range", "a", ())
    group = table.groups["G"]
    assert (group.state, group.generation, list(group.members), group.instances) == (
        GroupState.STABLE, 2, ["a", "b2"], {"ia": "a", "ib": "b2"})
    assert table.sync("G", "b2", 2, None, None, {}, 5.1, "ib") == SyncAnswer(g.NONE, "consumer", "range", b"p1")
    assert table.heartbeat("G", "a", 2, 5.2, "ia") == g.NONE          # no rebalance for the others
    # The old incarnation is fenced when it names its instance, unknown when it does not.
    assert table.heartbeat("G", "b", 2, 5.3, "ib") == g.FENCED_INSTANCE_ID
    assert table.heartbeat("G", "b", 2, 5.3) == g.UNKNOWN_MEMBER_ID
    assert table.sync("G", "b", 2, None, None, {}, 5.3, "ib") == SyncAnswer(g.FENCED_INSTANCE_ID)
    assert static_join(table, "ib", member_id="b", now=5.4) == JoinAnswer(g.FENCED_INSTANCE_ID, "b")
    assert table.check_commit("G", "b", 2, 5.4, "ib") == g.FENCED_INSTANCE_ID
    assert table.check_txn_commit("G", "b", 2, 5.4, "ib") == g.FENCED_INSTANCE_ID
    assert table.leave("G", ["b"], 5.4, ["ib"]) == [g.FENCED_INSTANCE_ID]
    assert table.check_commit("G", "b2", 2, 5.5, "ib") == g.NONE
    assert (group.state, group.generation, list(group.members)) == (GroupState.STABLE, 2, ["a", "b2"])


def test_a_restarted_static_leader_is_answered_with_the_old_leader_id_and_leads_the_next_rebalance() -> None:
    table = GroupTable()
    static_pair(table)
    answer = static_join(table, "ia", new_id="a2", now=5.0)
    assert answer is not None and (answer.leader, answer.members) == ("a", ())  # so it does not assign
    assert table.groups["G"].leader == "a2"
    assert table.sync("G", "a2", 2, None, None, {}, 5.1, "ia") == SyncAnswer(g.NONE, "consumer", "range", b"p0")
    assert static_join(table, "ic", new_id="c", now=6.0) is None          # a new member: a rebalance
    static_join(table, "ia", member_id="a2", now=6.1)
    static_join(table, "ib", member_id="b", now=6.2)
    joined = answers(table)
    assert joined[("join", "a2")].leader == "a2" and [m for m, _ in joined[("join", "a2")].members] == ["a2", "b", "c"]
    assert joined[("join", "a2")].instances == ("ia", "ib", "ic")


def test_a_static_member_restarting_with_other_protocols_or_mid_rebalance_rebalances() -> None:
    table = GroupTable()
    static_pair(table)
    assert static_join(table, "ib", new_id="b2", now=5.0, protocols=(("roundrobin", b"rr"),)) is None
    group = table.groups["G"]
    assert group.state is GroupState.PREPARING_REBALANCE and "b2" in group.members and "b" not in group.members
    # Replaced again while it waits in that join: the waiting call is answered FENCED_INSTANCE_ID.
    assert static_join(table, "ib", new_id="b3", now=5.5, protocols=(("roundrobin", b"rr"),)) is None
    assert answers(table) == {("join", "b2"): JoinAnswer(g.FENCED_INSTANCE_ID, "b2")}
    static_join(table, "ia", member_id="a", now=6.0, protocols=(("roundrobin", b"rr"), ("range", b"r")))
    joined = answers(table)
    assert joined[("join", "b3")].generation == 3 and group.protocol == "roundrobin"


def test_a_static_member_leaves_by_instance_id_or_expires_and_its_instance_is_free_again() -> None:
    table = GroupTable()
    static_pair(table)
    assert table.leave("G", [""], 5.0, ["ib"]) == [g.NONE]
    group = table.groups["G"]
    assert list(group.members) == ["a"] and group.instances == {"ia": "a"}
    assert group.state is GroupState.PREPARING_REBALANCE
    assert table.leave("G", [""], 5.0, ["nobody"]) == [g.UNKNOWN_MEMBER_ID]
    table.tick(5.0 + SESSION_MS / 1000 + REBALANCE_MS / 1000 + 1)           # a never joins again: gone
    assert "G" not in table.groups
    assert static_join(table, "ia", new_id="a9", now=100.0) is None        # a new member, a new join
    assert answers(table)[("join", "a9")].generation == 4  # after generation 3, which ended empty


def subscription_metadata(*topics: str, version: int = 1) -> bytes:
    """A consumer's ConsumerProtocolSubscription, as clients send it in JoinGroup."""
    body = struct.pack(">hi", version, len(topics))
    for topic in topics:
        body += struct.pack(">h", len(topic)) + topic.encode()
    return body + struct.pack(">i", -1) + struct.pack(">i", 0)  # user data (null), owned partitions (none)


def test_the_topics_a_group_consumes_come_from_its_members_subscriptions() -> None:
    assert g.subscription_topics(subscription_metadata("a", "bb")) == ["a", "bb"]
    assert g.subscription_topics(subscription_metadata(version=0)) == []
    for bad in [b"", b"\x00\x01", b"\x00\x01\x00\x00\x00\x02\x00\x01a", b"\xff\xff\x00\x00\x00\x00",
                b"\x00\x01\x00\x00\x00\x01\x00\x02\xff\xfe"]:
        assert g.subscription_topics(bad) is None, bad
    group = Group("g")
    assert group.consumed_topics() == set()
    for n, topics in enumerate([("a",), ("b", "a")]):
        group.members[f"m{n}"] = g.Member(f"m{n}", "c", 6000, 6000, (("range", subscription_metadata(*topics)),), 0.0)
    assert group.consumed_topics() == {"a", "b"}
    group.members["odd"] = g.Member("odd", "c", 6000, 6000, (("range", b"not a subscription"),), 0.0)
    assert group.consumed_topics() is None                       # unreadable: every topic counts


# --- the initial rebalance delay (KIP-134) ---------------------------------------------------


def delayed_table(delay_ms: int = 3_000) -> GroupTable:
    return GroupTable(initial_rebalance_delay_ms=delay_ms)


def test_the_first_rebalance_waits_the_initial_delay_even_when_everyone_known_joined() -> None:
    table = delayed_table()
    assert join(table, new_id="a", now=10.0) is None
    table.tick(12.9)
    assert answers(table) == {} and table.groups["G"].state is GroupState.PREPARING_REBALANCE
    table.tick(13.0)
    first = answers(table)[("join", "a")]
    assert (first.error, first.generation, first.leader) == (g.NONE, 1, "a")


def test_consumers_started_together_land_in_one_generation() -> None:
    """b joins during a's wait: the wait is extended by the delay from where it ended, then both
    get generation 1 (without the delay a would get generation 1 alone, then rebalance)."""
    table = delayed_table()
    assert join(table, new_id="a", now=0.0) is None
    assert join(table, new_id="b", now=1.0) is None
    table.tick(3.5)
    assert answers(table) == {}                              # extended to 6.0
    table.tick(5.99)
    assert answers(table) == {}
    table.tick(6.0)
    joined = answers(table)
    assert {k for k in joined} == {("join", "a"), ("join", "b")}
    assert {a.generation for a in joined.values()} == {1}
    assert [m for m, _ in joined[("join", "a")].members] == ["a", "b"]


def test_the_initial_delay_never_runs_past_the_rebalance_timeout() -> None:
    table = delayed_table()
    rebalance_s = 5.0
    # Members keep arriving every second; the rebalance timeout (5 s) bounds the wait.
    for i, t in enumerate((0.0, 1.0, 2.0, 3.0, 4.0)):
        assert table.join("G", "", f"m{i}", "client", "consumer", PROTOCOLS, SESSION_MS, int(rebalance_s * 1000),
                          t) is None
        assert answers(table) == {}
    table.tick(4.99)
    assert answers(table) == {}
    table.tick(rebalance_s)
    assert {a.generation for a in answers(table).values()} == {1}
    assert len(table.groups["G"].members) == 5


def test_only_the_first_rebalance_is_delayed() -> None:
    table = delayed_table()
    assert join(table, new_id="a", now=0.0) is None
    table.tick(3.0)
    answers(table)
    assert table.sync("G", "a", 1, "consumer", "range", {"a": b"all"}, 3.1) is None
    answers(table)
    assert join(table, new_id="b", now=4.0) is None        # a Stable group's rebalance
    assert join(table, member_id="a", now=4.1) is None     # everyone joined: done at once
    assert {a.generation for a in answers(table).values()} == {2}


def test_a_group_whose_members_all_leave_during_the_delay_is_dropped() -> None:
    table = delayed_table()
    assert join(table, new_id="a", now=0.0) is None
    assert table.leave("G", ["a"], 1.0) == [g.NONE]
    assert answers(table) == {("join", "a"): JoinAnswer(g.UNKNOWN_MEMBER_ID, "a")}
    assert "G" not in table.groups


def test_a_bad_initial_delay_is_refused() -> None:
    for bad in (-1, 1.5, "3000", g.MAX_INITIAL_REBALANCE_DELAY_MS + 1):
        with pytest.raises(g.InvalidArgument):
            GroupTable(initial_rebalance_delay_ms=bad)
