"""The local directory's conditional create: all or nothing, one winner, no staging file left."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from raytxn.ledger.storage import ObjectExists, Storage


def test_create_makes_its_directories_and_refuses_a_second_create(tmp_path: Path) -> None:
    storage = Storage.from_url(f"file://{tmp_path}")

    async def run() -> None:
        await storage.create("a/b/c/object", b"first")
        with pytest.raises(ObjectExists):
            await storage.create("a/b/c/object", b"second")
        assert await storage.get("a/b/c/object") == b"first"
        assert await storage.list("a/b/c") == ["a/b/c/object"]

    asyncio.run(run())
    assert sorted(p.name for p in (tmp_path / "a/b/c").iterdir()) == ["object"]  # no staging file


def test_concurrent_creates_of_one_path_have_one_winner(tmp_path: Path) -> None:
    storage = Storage.from_url(f"file://{tmp_path}")

    async def run() -> list[BaseException | None]:
        return await asyncio.gather(*(storage.create("race/object", bytes([i]) * 1000) for i in range(16)),
                                    return_exceptions=True)

    outcomes = asyncio.run(run())
    winners = [i for i, outcome in enumerate(outcomes) if outcome is None]
    assert len(winners) == 1 and all(isinstance(o, ObjectExists) for o in outcomes if o is not None)
    assert (tmp_path / "race/object").read_bytes() == bytes([winners[0]]) * 1000
    assert [p.name for p in (tmp_path / "race").iterdir()] == ["object"]


def test_a_large_object_is_written_whole(tmp_path: Path) -> None:
    storage = Storage.from_url(f"file://{tmp_path}")
    data = bytes(range(256)) * (9 << 12)  # 9 MiB: more than one write call may take
    asyncio.run(storage.create("big", data))
    assert (tmp_path / "big").read_bytes() == data


def test_a_create_returns_after_fsyncing_the_object_and_every_new_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The object, its directory, and each directory made for it (its entry in its parent) are
    fsynced before ``create`` returns; a directory's parents once per process."""
    import os

    import raytxn.ledger.storage as storage_module

    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        real_fsync(fd)
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(storage_module.os, "fsync", recording_fsync)
    storage = Storage.from_url(f"file://{tmp_path}")
    root = tmp_path.resolve()
    asyncio.run(storage.create("a/b/first", b"1"))
    assert sorted(synced) == sorted(str(p) for p in (root / "a/b/first", root / "a/b", root / "a", root))
    synced.clear()
    asyncio.run(storage.create("a/b/second", b"2"))
    assert sorted(synced) == sorted(str(p) for p in (root / "a/b/second", root / "a/b"))
