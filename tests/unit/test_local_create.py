"""The local directory's conditional create: all or nothing, one winner, no staging file left."""

from __future__ import annotations

import asyncio
import errno
import os
import stat
from pathlib import Path

import pytest

from raytxn.errors import InvalidArgument, StorageUnavailable
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
    """The object's bytes are fsynced before its name exists (a machine crash leaves the whole
    object or nothing there), and its directory and each directory made for it (its entry in its
    parent) before ``create`` returns; a directory's parents once per process."""
    import raytxn.ledger.storage as storage_module

    root = tmp_path.resolve()
    synced_files: list[tuple[int, bool]] = []  # (inode, whether the object's name existed then)
    synced_directories: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        real_fsync(fd)
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            synced_directories.append(os.readlink(f"/proc/self/fd/{fd}"))
        else:
            synced_files.append((info.st_ino, (root / "a/b/first").exists() or (root / "a/b/second").exists()))

    monkeypatch.setattr(storage_module.os, "fsync", recording_fsync)
    storage = Storage.from_url(f"file://{tmp_path}")
    asyncio.run(storage.create("a/b/first", b"1"))
    assert synced_files == [((root / "a/b/first").stat().st_ino, False)]
    assert sorted(synced_directories) == sorted(str(p) for p in (root / "a/b", root / "a", root))
    synced_files.clear()
    synced_directories.clear()
    (root / "a/b/first").rename(root / "a/b/moved")  # so the check above sees only the second's name
    asyncio.run(storage.create("a/b/second", b"2"))
    assert synced_files == [((root / "a/b/second").stat().st_ino, False)]
    assert synced_directories == [str(root / "a/b")]


@pytest.mark.parametrize("failing", ["write", "fsync", "link"])
def test_a_create_that_fails_leaves_no_object_and_no_staging_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    """A disk error at any step is StorageUnavailable (retriable), and the path stays free."""
    import raytxn.ledger.storage as storage_module

    def broken(*args: object) -> None:
        raise OSError(errno.EIO, f"injected {failing} failure")

    storage = Storage.from_url(f"file://{tmp_path}")
    asyncio.run(storage.create("d/warm", b"w"))  # the directory exists: the failure is the put's own
    with monkeypatch.context() as patch:
        patch.setattr(storage_module.os, failing, broken)
        with pytest.raises(StorageUnavailable, match=f"injected {failing} failure"):
            asyncio.run(storage.create("d/object", b"data"))
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["warm"]
    asyncio.run(storage.create("d/object", b"data"))  # the retry succeeds
    assert (tmp_path / "d/object").read_bytes() == b"data"


def test_a_staging_file_left_by_a_killed_writer_is_not_listed_and_goes_with_its_folder(tmp_path: Path) -> None:
    """A process killed between its staging write and the link leaves ``<path>#<n>``: listings
    do not show it, a create of the path still succeeds, and deleting the folder removes it."""
    storage = Storage.from_url(f"file://{tmp_path}")
    (tmp_path / "f").mkdir()
    leftover = tmp_path / f"f/object#{(os.getpid() << 32) + 7}"
    leftover.write_bytes(b"torn")

    async def run() -> None:
        assert await storage.list("f") == []
        await storage.create("f/object", b"whole")
        assert await storage.list("f") == ["f/object"]
        assert await storage.get("f/object") == b"whole"
        await storage.delete_folder("f")

    asyncio.run(run())
    assert list((tmp_path / "f").iterdir()) == []


@pytest.mark.parametrize("path", ["a/../escape", "/etc/absolute", "a//b", "./a", "a/b/"])
def test_a_path_that_is_not_plain_names_is_refused_and_writes_nothing(tmp_path: Path, path: str) -> None:
    """As obstore refuses such paths: nothing may be written outside the root, or under a name
    the listings would not give back."""
    storage = Storage.from_url(f"file://{tmp_path / 'root'}")
    with pytest.raises(InvalidArgument, match="not a relative path of plain names"):
        asyncio.run(storage.create(path, b"x"))
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_a_local_get_reads_the_object_or_says_none_and_refuses_a_path_outside_the_root(tmp_path: Path) -> None:
    """The local get reads files itself (not through obstore): what obstore's get gave must hold,
    an object's bytes, None for no object (also where a file or a folder stands in the way), and
    a storage error for a file that cannot be read."""
    storage = Storage.from_url(f"file://{tmp_path / 'root'}")
    outside = tmp_path / "secret"
    outside.write_bytes(b"outside the root")

    async def run() -> None:
        await storage.create("a/object", b"\x00bytes\xff" * 1000)
        assert await storage.get("a/object") == b"\x00bytes\xff" * 1000
        assert await storage.get("a/missing") is None
        assert await storage.get("a/object/below-a-file") is None
        assert await storage.get("a") is None  # a folder is no object
        for bad in ("../secret", "/etc/passwd", "a//object", "./a/object"):
            with pytest.raises(InvalidArgument, match="not a relative path of plain names"):
                await storage.get(bad)
        (tmp_path / "root" / "loop").symlink_to(tmp_path / "root" / "loop")
        with pytest.raises(StorageUnavailable, match="get loop"):
            await storage.get("loop")

    asyncio.run(run())
