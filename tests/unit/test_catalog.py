"""The catalog's entry states: CREATING -> ACTIVE -> DELETING -> removed, every transition checked,
and only ACTIVE entries visible to clients."""

from __future__ import annotations

import msgspec
import pytest

from raytxn.errors import CorruptLedger, InvalidArgument, NotAllowed, TopicAlreadyExists, TopicNotFound
from raytxn.protocol.catalog import (
    VALID_PREVIOUS_STATES,
    Catalog,
    EntryState,
    decode_catalog,
    encode_catalog,
)
from raytxn.protocol.retention import NO_RETENTION_POLICY

CREATING, ACTIVE, DELETING = EntryState.CREATING, EntryState.ACTIVE, EntryState.DELETING


def active_topic(name: str = "orders", partitions: int = 2) -> Catalog:
    return Catalog().with_topic(name, partitions, 1).with_topic_state(name, ACTIVE)


def test_a_topic_is_invisible_until_active_and_once_deleting() -> None:
    creating = Catalog().with_topic("orders", 2, 1)
    assert creating.topic_entry("orders").state is CREATING
    with pytest.raises(TopicNotFound, match="being created"):
        creating.topic("orders")
    active = creating.with_topic_state("orders", ACTIVE)
    assert active.topic("orders").partitions == 2
    deleting = active.with_topic_state("orders", DELETING)
    with pytest.raises(TopicNotFound, match="being deleted"):
        deleting.topic("orders")
    assert [t.name for t in deleting.topics_in(DELETING)] == ["orders"]
    assert deleting.without_topic("orders").topics == {}
    with pytest.raises(TopicNotFound):
        Catalog().topic_entry("orders")


def test_every_topic_transition_is_checked() -> None:
    catalogs = {CREATING: Catalog().with_topic("t", 1, 1)}
    catalogs[ACTIVE] = catalogs[CREATING].with_topic_state("t", ACTIVE)
    catalogs[DELETING] = catalogs[ACTIVE].with_topic_state("t", DELETING)
    for old, catalog in catalogs.items():
        for new in EntryState:
            if old in VALID_PREVIOUS_STATES[new]:
                assert catalog.with_topic_state("t", new).topic_entry("t").state is new
            else:
                with pytest.raises(NotAllowed, match=f"{old} -> {new} not allowed"):
                    catalog.with_topic_state("t", new)
                assert catalog.topic_entry("t").state is old  # unchanged
        if old is not DELETING:
            with pytest.raises(NotAllowed, match="only a DELETING topic"):
                catalog.without_topic("t")


def test_creating_again_is_refused_in_every_state() -> None:
    catalog = Catalog().with_topic("t", 1, 1)
    with pytest.raises(TopicAlreadyExists, match="exists with 1 partitions"):
        catalog.with_topic("t", 1, 2)
    deleting = catalog.with_topic_state("t", DELETING)
    with pytest.raises(TopicAlreadyExists, match="being deleted"):
        deleting.with_topic("t", 1, 2)
    with pytest.raises(InvalidArgument):
        Catalog().with_topic("t", 0, 1)


def test_removing_a_topic_takes_its_subscriptions_and_permissions() -> None:
    catalog = active_topic().with_subscription("orders", "billing", "earliest", 2).with_grant(
        "orders", "alice", ["produce"])
    version = catalog.permissions_version
    gone = catalog.with_topic_state("orders", DELETING).without_topic("orders")
    assert gone.subscriptions == {} and gone.permissions == {} and gone.permissions_version == version + 1


def test_subscription_states() -> None:
    catalog = active_topic().with_subscription("orders", "billing", "earliest", 2)
    assert catalog.subscription_names("orders") == []  # CREATING: not listed yet
    assert catalog.subscription_names("orders", (CREATING,)) == ["billing"]
    assert catalog.with_subscription("orders", "billing", "latest", 3) is catalog  # subscribing again
    active = catalog.with_subscription_state("orders", "billing", ACTIVE)
    assert active.subscription_names("orders") == ["billing"]
    with pytest.raises(NotAllowed, match="ACTIVE -> CREATING not allowed"):
        active.with_subscription_state("orders", "billing", CREATING)
    with pytest.raises(NotAllowed, match="only a DELETING one"):
        active.without_subscription("orders", "billing")
    deleting = active.with_subscription_state("orders", "billing", DELETING)
    assert [s.name for s in deleting.subscriptions_in(DELETING)] == ["billing"]
    assert deleting.subscription_names("orders") == []
    with pytest.raises(NotAllowed, match="being deleted"):
        deleting.with_subscription("orders", "billing", "latest", 3)
    gone = deleting.without_subscription("orders", "billing")
    assert gone.subscriptions["orders"] == {}
    assert gone.without_subscription("orders", "billing") is gone  # gone already: nothing to do
    with pytest.raises(NotAllowed, match="does not exist"):
        gone.with_subscription_state("orders", "billing", ACTIVE)
    with pytest.raises(TopicNotFound):  # no subscription on a topic that is not ACTIVE
        Catalog().with_topic("new", 1, 1).with_subscription("new", "s", "latest", 1)


def test_states_survive_encoding_and_old_catalogs_read_as_active() -> None:
    catalog = active_topic().with_subscription("orders", "billing", "earliest", 2).with_topic("next", 1, 3)
    assert decode_catalog(encode_catalog(catalog)) == catalog

    class OldTopic(msgspec.Struct):  # the record before entries had a state
        name: str
        partitions: int
        created_ms: int

    class OldCatalog(msgspec.Struct):
        topics: dict[str, OldTopic]

    old = msgspec.msgpack.encode(OldCatalog({"orders": OldTopic("orders", 3, 1)}))
    assert decode_catalog(old).topic("orders").state is ACTIVE
    assert decode_catalog(old).topic("orders").retention == NO_RETENTION_POLICY  # no policy


def test_bulk_create_is_all_or_none_and_follows_the_single_rules() -> None:
    catalog = active_topic("taken")
    made = catalog.with_topics(["a", "b"], 3, 7, subscriptions=["s1", "s2"])
    assert [made.topic_entry(n).state for n in ("a", "b")] == [CREATING, CREATING]
    assert made.topic_entry("a").partitions == 3 and made.subscription_names("a", (CREATING,)) == ["s1", "s2"]
    assert catalog.topics.keys() == {"taken"}  # the catalog is replaced, never changed in place
    for names, subs, position, error in [
        (["c", "taken"], [], "earliest", TopicAlreadyExists),
        (["c", "bad name"], [], "earliest", InvalidArgument),
        (["c", "c"], [], "earliest", InvalidArgument),
        (["c"], ["bad/sub"], "earliest", InvalidArgument),
        (["c"], ["s"], "middle", InvalidArgument),
    ]:
        with pytest.raises(error):
            catalog.with_topics(names, 1, 7, subscriptions=subs, initial_position=position)
    with pytest.raises(InvalidArgument):
        catalog.with_topics(["c"], 0, 7)
    active = made.with_topics_active(["a", "b"])
    assert active.topic("a").state is ACTIVE and active.subscription_names("b") == ["s1", "s2"]
    assert active.with_topics_active(["a"]).topic("a").state is ACTIVE  # already ACTIVE: stays


def test_bulk_delete_marks_then_removes_with_subscriptions_and_permissions() -> None:
    names = ["a", "b", "keep"]
    catalog = Catalog().with_topics(names, 1, 1, subscriptions=["s"]).with_topics_active(names)
    catalog = catalog.with_grant("a", "alice", ["produce"])
    with pytest.raises(NotAllowed):
        catalog.without_topics(["a"])  # only DELETING entries leave
    with pytest.raises(TopicNotFound):
        catalog.with_topics_deleting(["a", "missing"])
    deleting = catalog.with_topics_deleting(["a", "b"])
    assert deleting.topic_entry("a").state is DELETING and deleting.topic("keep").state is ACTIVE
    gone = deleting.without_topics(["a", "b", "already-gone"])
    assert set(gone.topics) == {"keep"} and set(gone.subscriptions) == {"keep"} and "a" not in gone.permissions
    assert gone.permissions_version == deleting.permissions_version + 1


@pytest.mark.parametrize("stored", [b"\xc1", b"not msgpack at all", encode_catalog(Catalog())[:-1],
                                    msgspec.msgpack.encode({"topics": 5})])
def test_bytes_that_are_not_a_catalog_are_a_corrupt_ledger_naming_it(stored: bytes) -> None:
    with pytest.raises(CorruptLedger, match="catalog") as caught:
        decode_catalog(stored)
    assert caught.value.path == "catalog"

