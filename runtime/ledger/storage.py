"""Object storage behind one URL, through obstore.

- ``file:///abs/path`` or ``file://./rel/path``: a local directory (the embedded default). A put
  writes a staging file, fsyncs it, links it into place and fsyncs its directory (and new
  directories in their parents), so an object is never visible partially and an acknowledged
  write also survives a machine crash. A get reads the file itself, inline (``_get_local``);
  listings and deletes go through obstore's LocalStore, which skips staging files as it skips its
  own.
- ``s3://bucket/prefix``: any S3-compatible store. Endpoint, keys, region and ``allow_http`` come
  from keyword options (``endpoint=``, ``access_key_id=``, ...) or the usual ``AWS_*`` variables.
- ``memory://name``: an in-process store for unit tests; the same name gives the same store.

The option ``write_format`` (``formats.py``) is the format every writer on this storage writes
in: the one setting a rolling upgrade keeps at the old release's format until every process runs
the new one. It travels with the URL's other options to every actor and task.

Only four operations are needed by the ledgers: conditional create, get, list, delete. Errors are
mapped onto ``raytxn.errors``: transport and server failures become ``StorageUnavailable``
(retriable); "already exists" is ``ObjectExists``, which the ledger turns into ``Fenced``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import math
import os
import re
import time
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlparse

import obstore
from obstore.exceptions import AlreadyExistsError, BaseError, NotFoundError, PreconditionError
from obstore.store import AzureStore, GCSStore, LocalStore, MemoryStore, S3Store

from raytxn import errors as raytxn_errors
from raytxn.errors import InvalidArgument, StorageUnavailable
from raytxn.ledger.formats import DEFAULT_WRITE_FORMAT, WRITE_FORMAT_OPTION, check_write_format

DEFAULT_URL = "file://./.raytxn-data"

_memory_stores: dict[str, MemoryStore] = {}

# A local create writes ``<path>#<n>`` first and links it into place, as LocalStore's own puts
# do; a process killed in between leaves that staging file behind, and LocalStore's listings
# skip such names (a name whose part after ``#`` is all digits).
_STAGING_NAME = re.compile(r"#\d+$")
# Staging numbers of this module's local creates: the pid (read per create, as a process may
# fork) and a counter keep writers apart; the staging file's O_EXCL open refuses any clash.
_staging_counter = itertools.count()
_STAGING_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_MAX_DURABLE_DIRECTORIES = 10_000  # directories known fsynced into their parents, per Storage

# obstore retries internally for up to 3 minutes by default; the ledger writer has its own retry
# loop with a deadline, so keep the client's short and bounded.
_RETRY = {"max_retries": 3, "retry_timeout": timedelta(seconds=10),
          "backoff": {"init_backoff": timedelta(milliseconds=50), "max_backoff": timedelta(seconds=1),
                      "base": 2}}
_S3_ENV = {
    "endpoint": "AWS_ENDPOINT_URL",
    "access_key_id": "AWS_ACCESS_KEY_ID",
    "secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "region": "AWS_REGION",
    "allow_http": "AWS_ALLOW_HTTP",
}


class ObjectExists(Exception):
    """A conditional create found the object already there."""


class ObjectInfo(NamedTuple):
    path: str
    size: int
    modified_ms: int  # the store's clock


class Storage:
    """One object store plus the key prefix everything lives under."""

    def __init__(self, store: object, url: str, local_root: Path | None = None, fsync: bool = True,
                 write_format: int = DEFAULT_WRITE_FORMAT) -> None:
        self.store = store
        self.url = url
        self.write_format = check_write_format(write_format)  # the format every object is written in
        self._local_root = local_root
        self._fsync = fsync and local_root is not None
        # The root as a str ending in "/": a put builds its paths as strs (pathlib cost 5% of a
        # partition's append in py-spy).
        self._root_prefix = None if local_root is None else os.path.join(str(local_root), "")
        self._durable_directories: set[str] = set()

    @classmethod
    def from_url(cls, url: str | None = None, **options: object) -> Storage:
        """Open the store a URL names. ``options`` go to the S3 client (endpoint, keys, ...), but
        for ``fsync`` (file://) and ``write_format`` (``formats.py``), which are this class's."""
        url = url or DEFAULT_URL
        parsed = urlparse(url)
        fsync = bool(options.pop("fsync", True))
        write_format = check_write_format(options.pop(WRITE_FORMAT_OPTION, DEFAULT_WRITE_FORMAT))
        if parsed.scheme == "memory":
            name = parsed.netloc + parsed.path
            store = _memory_stores.setdefault(name, MemoryStore())
            return cls(store, url, write_format=write_format)
        if parsed.scheme == "file" or parsed.scheme == "":
            raw = url[len("file://"):] if parsed.scheme == "file" else url
            root = Path(raw).expanduser().resolve()
            root.mkdir(parents=True, exist_ok=True)
            return cls(LocalStore(str(root), mkdir=True), url, local_root=root, fsync=fsync, write_format=write_format)
        if parsed.scheme == "s3":
            bucket = parsed.netloc
            if not bucket:
                raise InvalidArgument(f"storage URL {url!r} names no bucket")
            config: dict[str, object] = {}
            for key, env in _S3_ENV.items():
                value = options.pop(key, None) or os.environ.get(env)
                if value is not None:
                    config[key] = value
            if isinstance(config.get("allow_http"), str):
                config["allow_http"] = config["allow_http"].lower() in ("1", "true", "yes")
            config.setdefault("region", "us-east-1")
            timeout = options.pop("timeout", "5s")
            store = S3Store(bucket, prefix=parsed.path.strip("/") or None, retry_config=_RETRY,
                            client_options={"timeout": timeout, "connect_timeout": "2s"},
                            **config, **options)  # type: ignore[arg-type]
            return cls(store, url, write_format=write_format)
        if parsed.scheme in ("gs", "az", "azure"):
            # Google Cloud Storage and Azure Blob both support the conditional create every
            # ledger put relies on (ifGenerationMatch=0 / If-None-Match: *). Credentials come
            # from ``options`` or the stores' usual environment variables (GOOGLE_* / AZURE_*).
            bucket = parsed.netloc
            if not bucket:
                raise InvalidArgument(f"storage URL {url!r} names no bucket or container")
            store_class = GCSStore if parsed.scheme == "gs" else AzureStore
            timeout = options.pop("timeout", "5s")
            store = store_class(bucket, prefix=parsed.path.strip("/") or None, retry_config=_RETRY,
                                client_options={"timeout": timeout, "connect_timeout": "2s"},
                                **options)  # type: ignore[arg-type]
            return cls(store, url, write_format=write_format)
        raise InvalidArgument(f"unsupported storage URL {url!r}: use file://, s3://, gs://, az:// or memory://")

    async def create(self, path: str, data: bytes) -> None:
        """Write ``data`` at ``path`` only if nothing is there (``ObjectExists`` otherwise).
        Returns once the object is durable."""
        if self._local_root is not None:
            await asyncio.to_thread(self._create_local, path, data)
            self._full = None  # a put landed: there is room
            return
        try:
            await obstore.put_async(self.store, path, data, mode="create")
        except (AlreadyExistsError, PreconditionError) as e:
            raise ObjectExists(path) from e
        except (BaseError, OSError) as e:
            raise self._put_failed(path, e) from e
        self._full = None

    def _create_local(self, path: str, data: bytes) -> None:
        """A local directory's create, whole in one worker thread: written to a staging file
        named as LocalStore names its own (listings skip it), fsynced, linked into place (the
        link fails if the path exists: the conditional create), then the directory fsynced.

        The object's name appears only once its bytes are durable, so a machine crash leaves
        either nothing or the whole object at the path. obstore's put took a hop to its own
        runtime and two more to fsync threads; on this machine's ext4 a put fell from 1.1 to
        0.85 ms p50 (``putbench.py``, 900 interleaved puts)."""
        assert self._root_prefix is not None
        _check_relative(path)
        full = self._root_prefix + path
        staging = f"{full}#{(os.getpid() << 32) + next(_staging_counter)}"
        try:
            try:
                fd = os.open(staging, _STAGING_FLAGS, 0o666)
            except FileNotFoundError:  # the object's first in its directory
                os.makedirs(os.path.dirname(full), exist_ok=True)
                fd = os.open(staging, _STAGING_FLAGS, 0o666)
            try:
                try:
                    _write_all(fd, data)
                    if self._fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                try:
                    os.link(staging, full)
                except FileExistsError as e:
                    raise ObjectExists(path) from e
            finally:
                with contextlib.suppress(OSError):  # a process killed before this leaves it: see delete_folder
                    os.unlink(staging)
            if self._fsync:
                self._fsync_directories(os.path.dirname(full))
        except OSError as e:
            raise self._put_failed(path, e) from e

    def _fsync_directories(self, directory: str) -> None:
        """The directory's entry for a new object, and (once per directory and process) each
        directory's own entry in its parent, up to the root: ``mkdir`` makes missing
        directories without fsyncing their parents, so a new ledger's directory could otherwise
        vanish in a machine crash after its first acknowledged put."""
        assert self._root_prefix is not None
        _fsync_path(directory)
        if len(self._durable_directories) > _MAX_DURABLE_DIRECTORIES:
            self._durable_directories.clear()  # a bound: fsyncing one again is harmless
        root = os.path.dirname(self._root_prefix)
        while directory != root and directory not in self._durable_directories:
            parent = os.path.dirname(directory)
            if parent == directory:  # the filesystem's root: nothing above it
                break
            _fsync_path(parent)
            self._durable_directories.add(directory)
            directory = parent

    async def get(self, path: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        if self._root_prefix is not None:
            return self._get_local(path)
        try:
            result = await obstore.get_async(self.store, path)
            return bytes(await result.bytes_async())
        except (FileNotFoundError, NotFoundError):
            return None
        except (BaseError, OSError) as e:
            raise StorageUnavailable(f"get {path}: {_short(e)}") from e

    def _get_local(self, path: str) -> bytes | None:
        """A local directory's get, inline on the caller's loop. Ledger objects are 1 MiB at most
        but for a lone larger entry, and mostly in the page cache: a 200 KB object took 20 us this
        way, against 300 us through obstore's get (its runtime and back, twice; concurrent gets
        did not overlap) and 110 us through a worker thread (``getbench.py``). A partition's read
        of 20 entries (11 objects) spent 7 ms waiting on obstore's gets."""
        assert self._root_prefix is not None
        _check_relative(path)
        try:
            with open(self._root_prefix + path, "rb") as file:
                return file.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except OSError as e:
            raise StorageUnavailable(f"get {path}: {_short(e)}") from e

    async def list(self, prefix: str) -> list[str]:
        """Every object path under ``prefix`` (a folder), sorted."""
        return [info.path for info in await self.list_info(prefix)]

    async def list_info(self, prefix: str) -> list[ObjectInfo]:
        """Every object under ``prefix`` (a folder) with its size and modification time, by path."""
        try:
            chunks = await obstore.list(self.store, prefix.rstrip("/") + "/").collect_async()
        except (FileNotFoundError, NotFoundError):
            return []
        except (BaseError, OSError) as e:
            raise StorageUnavailable(f"list {prefix}: {_short(e)}") from e
        return sorted(ObjectInfo(meta["path"], meta["size"], int(meta["last_modified"].timestamp() * 1000))
                      for meta in chunks)

    async def list_folders(self, prefix: str) -> list[str]:
        """The folders right under ``prefix`` (their full paths), sorted."""
        try:
            listing = await obstore.list_with_delimiter_async(self.store, prefix.rstrip("/") + "/")
        except (FileNotFoundError, NotFoundError):
            return []
        except (BaseError, OSError) as e:
            raise StorageUnavailable(f"list {prefix}: {_short(e)}") from e
        return sorted(folder.rstrip("/") for folder in listing["common_prefixes"])

    async def delete(self, paths: list[str]) -> None:
        """Delete objects; missing ones are fine (deletes are retried after crashes)."""
        if not paths:
            return
        try:
            await obstore.delete_async(self.store, paths)
        except (FileNotFoundError, NotFoundError):
            for path in paths:  # one was missing: delete the rest one by one
                try:
                    await obstore.delete_async(self.store, path)
                except (FileNotFoundError, NotFoundError):
                    pass
        except (BaseError, OSError) as e:
            raise StorageUnavailable(f"delete {paths[0]}...: {_short(e)}") from e

    async def delete_folder(self, prefix: str) -> None:
        """Delete every object under ``prefix`` (a folder), and in a local directory also the
        staging files of puts whose process was killed mid-write: listings do not show them, so
        only this finds them, and a deleted topic or subscription must leave nothing behind."""
        await self.delete(await self.list(prefix))
        if self._local_root is not None:
            await asyncio.to_thread(self._delete_staging_files, prefix)

    def _delete_staging_files(self, prefix: str) -> None:
        assert self._local_root is not None
        for path in (self._local_root / prefix.strip("/")).rglob("*#*"):
            if _STAGING_NAME.search(path.name) and path.is_file():
                path.unlink(missing_ok=True)

    # --- a full store ------------------------------------------------------------------------
    #
    # Actors ask ``check_space`` before they accept new work (an append, a transactional ack, a
    # begin): while the store is full that work is refused at once with ``StorageFull``, having
    # changed nothing, instead of queueing behind puts that wait for space. What was accepted
    # before (a commit's markers, its coordinator records, cursors) is never refused: it waits
    # for space, and on a local disk it has a reserve to finish in, as a BookKeeper bookie turns
    # read-only before its disk is full. Full means:
    # - a local directory whose filesystem has less than ``local_reserve_bytes`` free (looked at
    #   every ``SPACE_CHECK_S``): new work stops while the rest of the disk still takes what was
    #   accepted;
    # - any store whose last put was refused for lack of space (``ENOSPC``, a quota, an S3 507),
    #   for ``FULL_HOLD_S`` after that refusal, or until a put lands.
    # Class attributes, the defaults: a simulator's store, never short of space, keeps them.

    _full: raytxn_errors.StorageFull | None = None  # the last put's refusal for lack of space (None: room)
    _full_at: float = 0.0             # when (time.monotonic)
    _space_checked_at: float = -math.inf  # when the local filesystem's free space was last looked at
    _space_short: str | None = None   # what it said, when it was short

    def _put_failed(self, path: str, error: BaseException) -> StorageUnavailable:
        """The error a failed put raises: ``StorageFull`` (and the store marked full) when the
        store said it has no room, else ``StorageUnavailable``."""
        if is_out_of_space(error):
            full = raytxn_errors.StorageFull(f"put {path}: no space left: {_short(error)}")
            self._full, self._full_at = full, time.monotonic()
            return full
        return StorageUnavailable(f"put {path}: {_short(error)}")

    def check_space(self) -> None:
        """Raise ``StorageFull`` while this store is known to be full: a put was refused for lack
        of space less than ``FULL_HOLD_S`` ago and none landed since. Past the hold a request is
        let through to try (space may be back); a writer retrying its put meanwhile keeps the
        mark fresh while there is still no room."""
        now = time.monotonic()
        full = self._full
        if full is not None and now - self._full_at < FULL_HOLD_S:
            raise raytxn_errors.StorageFull(f"storage {self.url} is full ({full}); nothing was written: retry once "
                                            "space is freed")
        if self._root_prefix is None:
            return
        if now - self._space_checked_at >= SPACE_CHECK_S:
            self._space_checked_at = now
            self._space_short = _short_of_space(self._root_prefix)
        if self._space_short is not None:
            raise raytxn_errors.StorageFull(f"storage {self.url} is full ({self._space_short}); nothing was "
                                            "written: retry once space is freed")

    def full_note(self) -> str:
        """" (the store is full: ...)" while ``check_space`` refuses, else "": for the message of a
        write that waited for space in vain."""
        full = self._full
        return f" (the store is full: {full})" if full is not None else ""


def _check_relative(path: str) -> None:
    if path.startswith("/") or "" in (parts := path.split("/")) or "." in parts or ".." in parts:
        raise InvalidArgument(f"object path {path!r} is not a relative path of plain names")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # not for a regular file; but a loop that cannot advance must not spin
            raise OSError(f"write wrote {written} bytes")
        view = view[written:]


def _fsync_path(path: str) -> None:
    """fsync a file or a directory (both open read-only for it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)



def _short(error: BaseException) -> str:
    return str(error).split("\n", 1)[0][:300]


# How long a refusal for lack of space keeps new work away (``Storage.check_space``).
FULL_HOLD_S = 2.0
SPACE_CHECK_S = 0.5  # how often a local store's free space is looked at (one statvfs)
# The room a local disk keeps for work already accepted: new work stops below this much free,
# 5% of the filesystem (BookKeeper's default read-only threshold is 95% used), 64 MiB at most.
RESERVE_SHARE = 0.05
MAX_RESERVE_BYTES = 64 << 20


def local_reserve_bytes(total_bytes: int) -> int:
    """The free space a local store of ``total_bytes`` keeps for accepted work."""
    return min(MAX_RESERVE_BYTES, int(total_bytes * RESERVE_SHARE))


def _short_of_space(directory: str) -> str | None:
    """What is short on the filesystem of ``directory`` (None: room, or it cannot tell)."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return None  # gone or unreadable: the put says what is wrong
    free, total = stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize
    reserve = local_reserve_bytes(total)
    if free < reserve:
        return f"{free} bytes free of {total}, below the {reserve} kept for work already accepted"
    return None


_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# How a full store shows through obstore, whose errors are not OSErrors: the Rust io error of a
# local filesystem ("No space left on device (os error 28)", a quota's 122), or an HTTP 507
# Insufficient Storage of an S3-compatible store (MinIO's XMinioStorageFull among them).
_FULL_MESSAGES = ("os error 28", "os error 122", "no space left on device", "disk quota exceeded",
                  "insufficient storage", "storagefull", "status 507", "507 insufficient")


def is_out_of_space(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) says the store has no room."""
    seen = 0
    current: BaseException | None = error
    while current is not None and seen < 8:  # a bound on the cause chain
        if isinstance(current, OSError) and current.errno in _FULL_ERRNOS:
            return True
        if isinstance(current, BaseError | OSError) and any(m in str(current).lower() for m in _FULL_MESSAGES):
            return True
        current = current.__cause__ or current.__context__
        seen += 1
    return False
