"""The gateways' peer view (``raytxn.kafka.peers``): who coordinates a group, who leads a partition
for a client, and how both move when a gateway dies or joins."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from raytxn.kafka.peers import (
    COORDINATOR_NOT_AVAILABLE,
    DEPARTED_LISTED_S,
    NOT_COORDINATOR,
    SETTLE_S,
    Peer,
    PeerView,
    client_zone,
)

PEERS = [Peer(i, "127.0.0.1", 9000 + i, "a" if i < 2 else "b") for i in range(4)]


def _view(me: int, live: list[Peer], now: float = 100.0, joined_at: float = 0.0) -> PeerView:
    view = PeerView(PEERS[me], joined_at=joined_at)
    view.refresh(live, now)
    return view


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=200, unique=True), st.integers(0, 3))
def test_a_dead_gateway_moves_only_its_own_groups_and_every_view_agrees(groups, dead):
    views = [_view(i, PEERS) for i in range(4)]
    before = {g: views[0].coordinator(g).node_id for g in groups}
    assert all(v.coordinator(g).node_id == before[g] for v in views for g in groups)  # one answer everywhere
    live = [p for p in PEERS if p.node_id != dead]
    survivors = [_view(p.node_id, live) for p in live]
    for g in groups:
        after = {v.coordinator(g).node_id for v in survivors}
        assert len(after) == 1 and dead not in after
        if before[g] != dead:
            assert after == {before[g]}  # a group whose coordinator lives stays where it is
    # each live gateway answers for exactly the groups it coordinates, and says NOT_COORDINATOR to the rest
    for v in survivors:
        for g in groups:
            mine = v.coordinator(g) == v.me
            assert v.coordinates(g, now=100.0) == (0 if mine else NOT_COORDINATOR)


def test_a_gateway_that_joined_waits_out_the_settling_time_before_it_coordinates():
    late = _view(3, PEERS, now=50.0, joined_at=50.0)
    mine = next(g for g in (f"g{i}" for i in range(100)) if late.coordinator(g) == late.me)
    assert late.coordinates(mine, now=50.0 + SETTLE_S / 2) == COORDINATOR_NOT_AVAILABLE
    assert late.coordinates(mine, now=50.0 + SETTLE_S) == 0
    alone = _view(3, [PEERS[3]], now=50.0, joined_at=50.0)  # one gateway alone has nobody to wait for
    assert alone.coordinates(mine, now=50.0) == 0


def test_a_dead_gateway_stays_listed_a_while_leading_and_coordinating_nothing():
    """librdkafka (#5511) needs a dead coordinator's broker listed to find the new one: it is, in
    Metadata's brokers only, until DEPARTED_LISTED_S passed or it came back."""
    view = _view(0, PEERS, now=100.0)
    view.refresh(PEERS[:3], now=101.0)  # 3 died
    assert [p.node_id for p in view.listed()] == [0, 1, 2, 3]
    assert [p.node_id for p in view.brokers()] == [0, 1, 2]
    assert 3 not in view.leaders("app", "orders", 12)
    assert all(view.coordinator(f"g{i}").node_id != 3 for i in range(100))
    view.refresh(PEERS[:3], now=101.0 + DEPARTED_LISTED_S - 0.5)  # still listed: from when it was last seen
    assert [p.node_id for p in view.listed()] == [0, 1, 2, 3]
    view.refresh(PEERS[:3], now=101.0 + DEPARTED_LISTED_S)
    assert [p.node_id for p in view.listed()] == [0, 1, 2]
    view.refresh(PEERS[:2], now=200.0)  # 2 died, then came back on another port: listed once, the new way
    back = Peer(2, "127.0.0.1", 9999, "b")
    view.refresh([*PEERS[:2], back], now=201.0)
    assert view.listed() == [PEERS[0], PEERS[1], back] and not view.departed


def test_partitions_are_led_by_the_clients_zone_first_and_spread_round_robin():
    view = _view(0, PEERS)
    assert set(view.leaders("app;zone=b", "orders", 8)) == {2, 3}
    assert set(view.leaders("app zone=a", "orders", 8)) == {0, 1}
    spread = view.leaders("app-1", "orders", 8)  # no zone: over every gateway, two partitions each
    assert sorted(spread) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert view.leaders("app;zone=elsewhere", "orders", 4) == view.leaders("app;zone=elsewhere", "orders", 4)
    assert sorted(view.leaders("app;zone=elsewhere", "orders", 4)) == [0, 1, 2, 3]  # no gateway there: all
    starts = {view.leaders(f"client-{i}", "orders", 1)[0] for i in range(40)}
    assert starts == {0, 1, 2, 3}  # different clients of one partition lean on different gateways


def test_a_zone_is_read_from_the_client_id_only_where_it_is_named():
    assert client_zone("svc;zone=us-east-1a") == "us-east-1a"
    assert client_zone("zone=eu") == "eu"
    assert client_zone("ozone=eu") is None and client_zone(None) is None and client_zone("") is None


def test_a_view_always_keeps_itself_and_checks_its_table():
    view = _view(1, [PEERS[0]])  # Ray did not list it (yet): it still serves as itself
    assert [p.node_id for p in view.brokers()] == [0, 1]
    view.check_invariants()
