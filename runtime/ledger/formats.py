"""Format versions of stored objects (design invariant 9; docs/concepts/formats.md).

Every object raytxn stores says the format it was written in, in its framing, one byte at a
fixed place that no format moves:

* frames (``framing.py``: ledger objects, stream metadata with its properties such as the catalog
  and cursors, compacted data, compaction horizons): byte 3 of each frame header. Frames written
  before versions existed hold 0 there (it was an unused flags byte): format 1.
* snapshot segments (``snapshots.py``): byte 3 of the magic, the letter ``G`` + (format - 1).
  ``RXSG``, the only magic before versions existed, is format 1; ``RXSH`` is format 2.

One number covers a whole release's formats: a frame's version says how its header and its payload
(entry records, log records, metadata) are encoded, a segment's how it and the snapshot are. A
release that changes any of them takes the next number; a kind it did not change reads the same
in either.

The rules (``docs/concepts/formats.md``): a release reads every format up to ``NEWEST_FORMAT``
and refuses a newer one with ``UnsupportedFormat`` naming the object and the version, never
guessing. It writes ``write_format`` (a storage option, ``DEFAULT_WRITE_FORMAT`` unless set),
which may not pass ``NEWEST_FORMAT``: during a rolling upgrade the old release still runs, so the
new one writes the old format until the operator raises the setting.
"""

from __future__ import annotations

from raytxn.errors import InvalidArgument, UnsupportedFormat

FORMAT_1 = 1                  # v0.1.0's layouts, written before objects said their version
NEWEST_FORMAT = 1             # the newest format this release reads and can write
# What the engine writes unless told otherwise: the newest format the previous release reads, so
# that an upgrade in place never writes what a process of that release still running cannot read.
DEFAULT_WRITE_FORMAT = 1
WRITE_FORMAT_OPTION = "write_format"  # its storage option (``Storage.from_url``)

assert 1 <= DEFAULT_WRITE_FORMAT <= NEWEST_FORMAT <= 255


def check_write_format(value: object) -> int:
    """``value`` as a format this release can write; ``InvalidArgument`` for anything else (a
    format above ``NEWEST_FORMAT`` is one this release does not know how to write)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"write_format must be a format number >= 1, not {value!r}")
    if value > NEWEST_FORMAT:
        raise InvalidArgument(f"write_format {value} is newer than this release writes (formats 1 to "
                              f"{NEWEST_FORMAT}): upgrade every process first")
    return value


def refuse(what: str, path: str, version: int, note: str = "") -> UnsupportedFormat:
    """The error for an object of a format this release does not read."""
    return UnsupportedFormat(f"{what} {path} is in format {version}, newer than this release reads "
                             f"(formats 1 to {NEWEST_FORMAT}){note}; read it with a newer raytxn", path, version)
