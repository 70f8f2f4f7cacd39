"""Data written by earlier releases reads back right (issue 59; docs/concepts/formats.md).

Each folder of ``tests/fixtures/golden`` is a store an earlier release wrote and crashed on
(``tests/fixtures/make_golden.py``) with a manifest of what it holds. The engine is started on a
copy of it and every message, cursor, pending ack, transaction outcome, transactional id epoch,
lease range, compacted view and Kafka offset is checked against the manifest, after recovery
did what the rules say: the open transaction whose deadline passed is aborted as timed out, the
one still open is committed by its owner. A damaged object stops the reader with an error naming
it, never a silent misread.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import raytxn as rt
from raytxn.client.rpc import ActorRef
from raytxn.cluster import stop_engine
from raytxn.errors import CorruptLedger, Fenced
from raytxn.ids import Position, TxnID, partition_actor_name, partition_stream, subscription_actor_name
from raytxn.ledger import ManagedLedger
from raytxn.ledger.compacted import read_kept, read_published
from raytxn.ledger.formats import DEFAULT_WRITE_FORMAT
from raytxn.ledger.framing import MAGIC, decode_frames
from raytxn.ledger.metadata import meta_prefix, read_metadata
from raytxn.ledger.snapshots import join_segments, newest_complete
from raytxn.ledger.storage import Storage
from raytxn.protocol.entry_format import decode_entry
from raytxn.protocol.txnlog import EndAction
from tests.engine import nothing_more, receive_all

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden"
FIXTURES = sorted(path for path in GOLDEN.iterdir() if (path / "manifest.json").exists())
VISIBLE = ("plain", "committed", "held")  # "held": visible once the test commits the open txn


def load_manifest(fixture: Path) -> dict[str, Any]:
    return json.loads((fixture / "manifest.json").read_text())


def copy_store(fixture: Path, tmp_path: Path) -> Path:
    store = tmp_path / "store"
    shutil.copytree(fixture / "store", store)
    return store


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.name for f in FIXTURES])
def test_fixture_is_as_written(fixture: Path) -> None:
    """A fixture is never rewritten: its objects are the bytes its release wrote."""
    objects = load_manifest(fixture)["objects"]
    stored = sorted(p.relative_to(fixture / "store").as_posix() for p in (fixture / "store").rglob("*") if p.is_file())
    assert stored == [row["path"] for row in objects]
    for row in objects:
        assert hashlib.sha256((fixture / "store" / row["path"]).read_bytes()).hexdigest() == row["sha256"], row["path"]


@pytest.fixture(scope="module", params=FIXTURES, ids=[f.name for f in FIXTURES])
def opened(request: pytest.FixtureRequest, ray_session: Any,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[rt.Client, dict[str, Any], Path]]:
    """The engine started on a copy of the fixture, as the owner of its transactions."""
    manifest = load_manifest(request.param)
    store = copy_store(request.param, tmp_path_factory.mktemp("golden"))
    stop_engine()
    client = rt.connect(storage=f"file://{store}", owner=manifest["owner"])
    try:
        yield client, manifest, store
    finally:
        client.close()
        stop_engine()


def txn_of(manifest: dict[str, Any], name: str) -> TxnID:
    return TxnID(*manifest["txns"][name]["id"])


def wait_ended(client: rt.Client, txn: TxnID, deadline_ms: int) -> dict[str, Any]:
    """The txn's description once it ended; waits past its deadline (a fixture written minutes
    ago holds a txn whose deadline is still to come) plus the time the engine takes to end it."""
    wait_s = max(0.0, deadline_ms / 1000 - time.time())
    if wait_s:
        print(f"{txn}'s deadline is {wait_s:.0f} s away (a fresh fixture): waiting for it")
    give_up = time.monotonic() + wait_s + 60
    while (info := client.describe_transaction(txn))["state"] not in ("COMMITTED", "ABORTED"):
        assert time.monotonic() < give_up, f"{txn} still {info['state']} after its deadline"
        time.sleep(0.2)
    return info


def rt_describe(client: rt.Client, txn: TxnID) -> dict[str, Any]:
    return client.describe_transaction(txn)


def partition_messages(topic: str, partition: int) -> list[list[Any]]:
    """``[[ledger, entry, batch index], key, value]`` of every message the partition serves."""
    rows, position = [], Position(0, 0)
    while True:
        result = ActorRef(partition_actor_name(topic, partition)).call("read", position, 1000)
        for at, records in result["entries"]:
            for index, message in enumerate(decode_entry(records)[1]):
                rows.append([[at.ledger_id, at.entry_id, index], message.key, message.value.decode()])
        if result["next"] == position:
            return rows
        position = result["next"]


def expected_messages(manifest: dict[str, Any], where: str, outcomes: tuple[str, ...] = VISIBLE) -> list[list[Any]]:
    return [[row["id"], row["key"], row["value"]] for row in manifest["messages"][where] if row["outcome"] in outcomes]


@pytest.mark.slow(seconds=40)
def test_reads_what_the_release_wrote(opened: tuple[rt.Client, dict[str, Any], Path]) -> None:
    client, manifest, store = opened
    txns = manifest["txns"]

    # The open txn past its deadline is aborted as timed out; every other outcome is the logged one.
    wait_ended(client, txn_of(manifest, "open-times-out"), txns["open-times-out"]["deadline_ms"])
    for name, row in txns.items():
        info = client.describe_transaction(txn_of(manifest, name))
        assert info.get("outcome", info["state"]) == row["outcome"], (name, info)

    # The txn still open: its acks pending on billing, its message on parts/1 not yet readable.
    billing = ActorRef(subscription_actor_name("orders", 0, "billing"))
    cursor = manifest["cursors"]["orders/0/billing"]
    stats = billing.call("stats")
    assert stats["pending_ack"]["per_txn"] == cursor["pending_held"]
    for key in ("mark_delete_position", "acked_ranges", "partially_acked_batches"):
        assert stats[key] == cursor[key], key
    assert partition_messages("parts", 1) == expected_messages(manifest, "parts/1", ("plain", "committed"))
    client.coordinators.end_txn(txn_of(manifest, "open-held"), EndAction.COMMIT)
    assert client.describe_transaction(txn_of(manifest, "open-held"))["state"] == "COMMITTED"

    # Every message of every partition, at its id; aborted, timed-out and trimmed ones never.
    for where in manifest["messages"]:
        topic, partition = where.split("/")
        assert partition_messages(topic, int(partition)) == expected_messages(manifest, where), where
    for where, trimmed_below in manifest["trimmed_below"].items():
        topic, partition = where.split("/")
        assert ActorRef(partition_actor_name(topic, int(partition))).call("stats")["trimmed_below"] == trimmed_below

    # Cursors: billing hands out exactly what was not acked (the timed-out txn's ack undone,
    # the held txn's applied), in order.
    consumer = client.subscribe("orders", "billing")
    got = [m.value().decode() for m in receive_all(consumer, len(cursor["redelivered"]))]
    assert got == cursor["redelivered"]
    assert nothing_more(consumer)
    consumer.close()

    # The lease held at the crash is handed out again, and its range reads from storage.
    lease = manifest["leases"]["orders/bulk/0"]
    leased = client.lease_ranges("orders", "bulk", lease["holder"], lease["epoch"], max_entries=3)
    held = leased.leases[0]
    assert [[held.start.ledger_id, held.start.entry_id], [held.end.ledger_id, held.end.entry_id]] == \
        [lease["start"], lease["end"]]
    values = [v.decode() for chunk in leased.chunks() for v in chunk.read(["value"])["value"].to_pylist()]
    assert values == lease["values"]
    leased.release()

    # Kafka group offsets and their metadata.
    for where, committed in manifest["kafka_offsets"]["kgroup"].items():
        topic, partition = where.split("/")
        found = ActorRef(subscription_actor_name(topic, int(partition), "kgroup")).call("kafka_committed")
        offset = ActorRef(partition_actor_name(topic, int(partition))).call(
            "kafka_offset_of", found["position"], found["index"])
        assert (offset, found["metadata"]) == (committed["offset"], committed["metadata"]), where

    # The compacted topic: its published generation and the view (tombstones as None).
    for where, compacted in manifest["compacted"].items():
        topic, partition = where.split("/")
        view = [{"offset": r["offset"], "key": r["key"], "value": None if r["value"] is None else r["value"].decode()}
                for r in client.read_compacted(topic, int(partition))]
        assert view == compacted["view"], where
        published = asyncio.run(read_published(Storage.from_url(f"file://{store}"),
                                               partition_stream(topic, int(partition))))
        assert published is not None and published.horizon.generation == compacted["generation"]

    # Transactional ids: an old epoch is fenced, the stored one works, a registration bumps it.
    for tid, epoch in manifest["tids"].items():
        with pytest.raises(Fenced):
            client.new_transaction(timeout=30, transactional_id=tid, epoch=epoch - 1)
        client.new_transaction(timeout=30, transactional_id=tid, epoch=epoch).abort()
        assert client.register_transactional_id(tid) == epoch + 1

    # The store now holds this release's frames beside the old release's, and every frame reads.
    before, after = frame_versions(fixture_store(manifest)), frame_versions(store)
    assert after.get(DEFAULT_WRITE_FORMAT, 0) > 0, after
    assert set(before) <= set(after), (before, after)


def fixture_store(manifest: dict[str, Any]) -> Path:
    return GOLDEN / manifest["release"] / "store"


def frame_versions(store: Path) -> dict[int, int]:
    """How many framed objects (all but snapshot segments) carry each version byte; each is
    decoded whole on the way (``CorruptLedger`` otherwise)."""
    found: dict[int, int] = {}
    for path in store.rglob("*"):
        data = path.read_bytes() if path.is_file() else b""
        if data[:2] == MAGIC and "snapshots" not in path.parts:
            decode_frames(data, path.as_posix())
            found[data[3]] = found.get(data[3], 0) + 1
    return found


# --- damage is named, never misread --------------------------------------------------------


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))


async def _read_stream(storage: Storage, stream: str) -> None:
    ledger = await ManagedLedger.open(storage, stream, writable=False)
    await ledger.read(max(ledger.trimmed_below, Position(0, 0)), max_entries=100_000)


async def _read_snapshot(storage: Storage, prefix: str) -> None:
    found = newest_complete(await storage.list(prefix))
    assert found is not None
    join_segments([await storage.get(name) or b"" for name in found[1]], found[0], prefix, found[1])


async def _read_compacted(storage: Storage, stream: str) -> None:
    await read_kept(storage, await read_published(storage, stream))


DAMAGED = {  # object kind -> (the object to flip, relative to the store; how a reader meets it)
    "ledger entry": ("streams/topics/orders/0/ledgers/000000000001/000000000000",
                     lambda s: _read_stream(s, "topics/orders/0")),
    "coordinator log": ("streams/coordinator/1/log/ledgers/000000000000",
                        lambda s: _read_stream(s, "coordinator/1/log")),
    "pending-ack log": ("streams/subscriptions/orders/0/billing/pending-ack/ledgers/000000000000",
                        lambda s: _read_stream(s, "subscriptions/orders/0/billing/pending-ack")),
    "stream metadata": (meta_prefix("catalog"), lambda s: read_metadata(s, "catalog")),
    "snapshot segment": ("topics/orders/0/snapshots", lambda s: _read_snapshot(s, "topics/orders/0/snapshots")),
    "compacted data": ("streams/topics/table/0/compacted/data", lambda s: _read_compacted(s, "topics/table/0")),
    "compaction horizon": ("streams/topics/table/0/compacted/horizons",
                           lambda s: _read_compacted(s, "topics/table/0")),
}


@pytest.mark.parametrize("kind", sorted(DAMAGED))
@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.name for f in FIXTURES])
def test_a_flipped_byte_is_named(fixture: Path, kind: str, tmp_path: Path) -> None:
    """One byte flipped in an object of each kind: the reader raises ``CorruptLedger`` naming
    that object (a folder given: its last object, which the reader reads)."""
    store = copy_store(fixture, tmp_path)
    target, read = DAMAGED[kind]
    path = store / target
    if path.is_dir():
        path = max(p for p in path.rglob("*") if p.is_file())
    storage = Storage.from_url(f"file://{store}")
    asyncio.run(read(storage))  # undamaged, it reads
    _flip(path)
    with pytest.raises(CorruptLedger) as caught:
        asyncio.run(read(storage))
    assert caught.value.path == path.relative_to(store).as_posix(), str(caught.value)
    assert caught.value.path in str(caught.value)
