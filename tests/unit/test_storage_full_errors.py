"""How a full store is told apart (``raytxn.ledger.storage``): the errors that mean "no room"
become ``StorageFull`` and mark the store full for a while; others stay ``StorageUnavailable``."""

from __future__ import annotations

import asyncio
import errno
import uuid

import pytest
from obstore.exceptions import GenericError

from raytxn.errors import StorageFull, StorageUnavailable
from raytxn.ledger import storage as storage_module
from raytxn.ledger.storage import Storage, is_out_of_space, local_reserve_bytes


@pytest.mark.parametrize("error", [
    OSError(errno.ENOSPC, "No space left on device"),
    OSError(errno.EDQUOT, "Disk quota exceeded"),
    GenericError("Generic LocalFileSystem error: No space left on device (os error 28)"),
    GenericError("Server returned non-2xx status code: 507 Insufficient Storage: <Code>XMinioStorageFull</Code>"),
])
def test_out_of_space_errors_are_told_apart(error: BaseException) -> None:
    assert is_out_of_space(error)
    wrapped = RuntimeError("put failed")
    wrapped.__cause__ = error
    assert is_out_of_space(wrapped)


@pytest.mark.parametrize("error", [
    OSError(errno.EIO, "Input/output error"),
    OSError(errno.ENOENT, "No such file"),
    GenericError("Server returned non-2xx status code: 503 Service Unavailable"),
    ValueError("no space left on device"),  # not a storage error at all
])
def test_other_errors_are_not_out_of_space(error: BaseException) -> None:
    assert not is_out_of_space(error)


def test_a_refused_put_marks_the_store_full_until_a_put_lands(monkeypatch: pytest.MonkeyPatch) -> None:
    storage = Storage.from_url(f"memory://{uuid.uuid4().hex}")
    storage.check_space()  # room
    assert isinstance(storage._put_failed("a/b", GenericError("Service Unavailable")), StorageUnavailable)
    storage.check_space()  # an outage is not a full store
    full = storage._put_failed("a/b", OSError(errno.ENOSPC, "No space left on device"))
    assert type(full) is StorageFull and full.retriable and "a/b" in str(full)
    with pytest.raises(StorageFull, match="nothing was written"):
        storage.check_space()
    assert "full" in storage.full_note()
    clock = [0.0]
    monkeypatch.setattr(storage_module.time, "monotonic", lambda: storage._full_at + clock[0])
    clock[0] = storage_module.FULL_HOLD_S + 0.1
    storage.check_space()  # past the hold: the next request is let through to try
    clock[0] = 0.0
    with pytest.raises(StorageFull):
        storage.check_space()
    asyncio.run(storage.create("c/d", b"x"))  # a put landed: room again
    storage.check_space()
    assert storage.full_note() == ""


def test_the_local_reserve_is_five_percent_up_to_64_mib() -> None:
    assert local_reserve_bytes(8 << 20) == int((8 << 20) * 0.05)
    assert local_reserve_bytes(1 << 40) == 64 << 20
    assert local_reserve_bytes(0) == 0
