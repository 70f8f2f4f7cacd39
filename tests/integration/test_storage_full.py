"""A disk that fills (issue 59): the engine's ``file://`` storage on a tmpfs of 8 MiB mounted by
the test, filled by a filler file.

- Below the reserve (``local_reserve_bytes``: 5% of the disk, at most 64 MiB) new work is
  refused at once with ``StorageFull`` (a producer's send after its retries, a transaction's
  begin, a transactional ack), having changed nothing, while what was accepted before (a commit,
  a timed-out txn's abort) still completes in the reserve.
- Full to the last byte, accepted work waits for space; freeing space (deleting the filler)
  lets it finish by itself, with no restart: the commit lands whole, the timed-out txn aborts.
- Throughout, nothing acknowledged is lost, no txn is half visible, no object is left partial
  (no staging file, every ledger entry readable), and a refused write never shows up later.

The mount needs root (or a user namespace allowing it): without it the module skips, saying why.
"""

from __future__ import annotations

import errno
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import raytxn as rt
from raytxn.cluster import stop_engine
from raytxn.errors import StorageFull, TransactionNotFound
from raytxn.ledger.storage import SPACE_CHECK_S, local_reserve_bytes
from tests.engine import visible_values, wait_for

pytestmark = pytest.mark.ray

DISK = "8m"
SEND_TIMEOUT_S = 5.0
CLIENT_DEADLINE_S = 10.0  # how long the client retries a refused begin or ack before raising it


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("small-disk")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        reason = (f"cannot mount a {DISK} tmpfs at {where} ({mounted.stderr.strip() or mounted.returncode}): "
                  "the disk-full tests need root or a user namespace that allows mounts")
        print(reason)
        pytest.skip(reason)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture(scope="module")
def client(ray_session: object, small_disk: Path) -> Iterator[rt.Client]:
    stop_engine()
    client = rt.connect(storage=f"file://{small_disk}/engine", deadline_s=CLIENT_DEADLINE_S)
    try:
        yield client
    finally:
        client.close()
        stop_engine()


def free_bytes(directory: Path) -> int:
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize


def fill(directory: Path, leave_bytes: int) -> Path:
    """A filler file taking the disk's space but ``leave_bytes`` (0: to the last byte)."""
    filler = directory / f"filler-{uuid.uuid4().hex[:6]}"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        chunk = 1 << 20
        while chunk >= 1 and free_bytes(directory) > leave_bytes:
            size = min(chunk, max(1, free_bytes(directory) - leave_bytes))
            try:
                os.write(fd, b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                chunk //= 2  # the last pages: smaller writes until not even a byte fits
    finally:
        os.close(fd)
    time.sleep(SPACE_CHECK_S * 2)  # each actor looks at the free space that often
    return filler


def staging_files(directory: Path) -> list[Path]:
    """Puts caught half done: a local create writes ``<name>#<n>`` first (runtime/ledger/storage.py)."""
    return [path for path in directory.rglob("*#*") if path.name.rsplit("#", 1)[-1].isdigit()]


def values(topic: str) -> list[bytes]:
    return visible_values(topic, [0, 1], deadline_s=60)


def refused(action: Any, limit_s: float) -> StorageFull:
    """``action`` raises ``StorageFull`` within ``limit_s`` seconds; returns it."""
    began = time.monotonic()
    with pytest.raises(StorageFull) as caught:
        action()
    assert time.monotonic() - began < limit_s, f"refused only after {time.monotonic() - began:.1f}s"
    assert "full" in str(caught.value)
    return caught.value


def commit_in_background(txn: Any) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def commit() -> None:
        try:
            txn.commit()
            outcome.append("COMMITTED")
        except rt.errors.RaytxnError as e:
            outcome.append(e)

    thread = threading.Thread(target=commit, daemon=True)
    thread.start()
    return thread, outcome


def topic_with_messages(client: rt.Client, prefix: str) -> tuple[str, Any, list[bytes]]:
    """A new topic of two partitions, a producer, and the ten messages it sent there."""
    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 2)
    producer = client.create_producer(topic, send_timeout_s=SEND_TIMEOUT_S)
    before = [f"before-{i}".encode() for i in range(10)]
    for i, value in enumerate(before):
        producer.send(value, key=str(i))
    return topic, producer, before


def check_all_or_nothing(stored: list[bytes], txn_values: list[bytes]) -> bool:
    """Whether ``txn_values`` are all stored (True) or none (False): never some."""
    shown = [v for v in txn_values if v in stored]
    assert len(shown) in (0, len(txn_values)), f"half visible: {shown} of {txn_values}"
    return bool(shown)


@pytest.mark.slow(seconds=25)  # 18 s beside another test on 2 cores
def test_below_the_reserve_new_work_is_refused_and_accepted_work_completes(client: rt.Client,
                                                                             small_disk: Path) -> None:
    topic, producer, before = topic_with_messages(client, "reserve")
    accepted = client.new_transaction(timeout=60)
    accepted_values = [f"accepted-{k}".encode() for k in range(2)]
    for k, value in enumerate(accepted_values):
        producer.send(value, key=f"a{k}", txn=accepted)
    total = os.statvfs(small_disk).f_blocks * os.statvfs(small_disk).f_frsize
    filler = fill(small_disk, leave_bytes=local_reserve_bytes(total) // 2)
    try:
        assert 0 < free_bytes(small_disk) < local_reserve_bytes(total)
        late = client.create_producer(topic, send_timeout_s=SEND_TIMEOUT_S)
        refused(lambda: late.send(b"refused-plain", key="r"), SEND_TIMEOUT_S + 10)
        txn = client.new_transaction(timeout=60)
        refused(lambda: late.send(b"refused-txn", key="r", txn=txn), CLIENT_DEADLINE_S + 10)  # its begin
        with pytest.raises(StorageFull):  # abort-only after its failed send: aborted, the cause raised
            txn.commit()
        # Accepted before: its commit (the coordinator's records, two markers) fits in the reserve.
        accepted.commit()
        stored = values(topic)
        assert check_all_or_nothing(stored, accepted_values)
        assert set(before) <= set(stored)
        assert not {b"refused-plain", b"refused-txn"} & set(stored)
    finally:
        filler.unlink()
    late.send(b"after", key="x")
    stored = values(topic)
    assert b"after" in stored and not {b"refused-plain", b"refused-txn"} & set(stored)
    assert not staging_files(small_disk)


@pytest.mark.timeout(900)  # a live workload for minutes on a loaded machine
@pytest.mark.slow(seconds=45)  # 36 s beside another test
def test_a_disk_full_to_the_last_byte_waits_then_recovers_by_itself(client: rt.Client, small_disk: Path) -> None:
    topic, producer, before = topic_with_messages(client, "full")
    consumer = client.subscribe(topic, "billing", initial_position=rt.InitialPosition.Earliest)
    committing = client.new_transaction(timeout=120)
    committing_values = [f"committing-{k}".encode() for k in range(4)]
    for k, value in enumerate(committing_values):
        producer.send(value, key=f"c{k}", txn=committing)  # on both partitions
    dangling = client.new_transaction(timeout=8)  # its client gives up on it: it times out
    producer.send(b"dangling", key="d", txn=dangling)
    received = [consumer.receive(timeout=30) for _ in range(4)]
    consumer.acknowledge_async(received[0]).result(timeout=30)  # applied before the disk fills
    acking = client.new_transaction(timeout=120)
    consumer.acknowledge(received[1], txn=acking)  # registered with the subscription before the disk fills

    filler = fill(small_disk, leave_bytes=0)
    try:
        late = client.create_producer(topic, send_timeout_s=SEND_TIMEOUT_S)
        refused(lambda: late.send(b"refused-plain", key="r"), SEND_TIMEOUT_S + 10)
        # The subscription refuses the ack at once: nothing pending for it, its cursor as it was.
        refused(lambda: consumer.acknowledge(received[2], txn=acking), CLIENT_DEADLINE_S + 10)
        thread, outcome = commit_in_background(committing)  # accepted: it waits for space
        time.sleep(12)  # past the dangling txn's timeout: its abort waits for space too
        assert thread.is_alive() and not outcome, f"a commit finished on a full disk: {outcome}"
        stored = values(topic)  # reads go on, and show nothing of the txns still open
        assert set(before) <= set(stored)
        assert not check_all_or_nothing(stored, committing_values)
        assert b"dangling" not in stored
        assert not staging_files(small_disk)
    finally:
        filler.unlink()  # space is back: nothing is restarted, nothing is called again
    thread.join(timeout=90)
    assert outcome == ["COMMITTED"], outcome
    stored = values(topic)
    assert check_all_or_nothing(stored, committing_values)
    assert set(before) <= set(stored)
    assert not {b"refused-plain", b"dangling"} & set(stored), "a refused or aborted write shows"

    def dangling_ended() -> bool:
        try:
            return client.describe_transaction(dangling.id)["state"] == "ABORTED"
        except TransactionNotFound:
            return True
    wait_for(dangling_ended, 60, "the dangling txn's abort")
    with pytest.raises(StorageFull):  # abort-only: its ack was refused; aborted, the cause raised
        acking.commit()
    # Nothing of ``acking`` took (its refused ack, its pending one aborted): a new consumer gets
    # everything but the one message acked plainly.
    consumer.close()
    consumer = client.subscribe(topic, "billing")
    again = []
    while True:
        try:
            again.append(consumer.receive(timeout=5).value())
        except rt.errors.Timeout:
            break
    # The plain ack was applied before the disk filled, but a plain ack is durable only once the
    # cursor is stored: a subscription restarted while the disk was full may give that one message
    # again (Pulsar's rule for plain acks too). Nothing else comes again, nothing is missing.
    # The first message received is the one acked plainly: on two partitions it need not be before[0].
    plain_acked = received[0].value()
    expected = sorted(value for value in [*before, *committing_values] if value != plain_acked)
    assert sorted(value for value in again if value != plain_acked) == expected, again
    assert again.count(plain_acked) <= 1, again
    late.send(b"after", key="x")
    assert b"after" in values(topic)
    assert not staging_files(small_disk)
