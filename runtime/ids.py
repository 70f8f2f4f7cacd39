"""Identifiers: ledger positions, transaction ids, and the naming rules.

Positions and transaction ids are frozen, ordered msgspec structs: hashable, comparable, cheap to
encode, and they pickle across Ray.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import msgspec

from raytxn.errors import InvalidArgument, InvalidTopicName
from raytxn.hashing import stable_hash


class Position(msgspec.Struct, frozen=True, order=True, array_like=True):
    """An entry of a managed ledger: ``(ledger_id, entry_id)``, totally ordered per stream."""

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"<{self.ledger_id},{self.entry_id}>"


# The position before every real one: "nothing read yet" / "nothing acked yet".
EARLIEST = Position(-1, -1)


class TxnID(msgspec.Struct, frozen=True, order=True, array_like=True):
    """A transaction: the coordinator that owns it and that coordinator's sequence number.

    Sequences are never reused by a coordinator, also across restarts."""

    tc_id: int
    sequence: int

    def __str__(self) -> str:
        return f"txn({self.tc_id},{self.sequence})"


_TXN_TEXT = re.compile(r"^\s*(?:txn\(\s*(\d+)\s*,\s*(\d+)\s*\)|(\d+)\s*,\s*(\d+))\s*$")


def parse_txn_id(value: object) -> TxnID:
    """A TxnID as given: itself, ``"txn(0,42)"`` (how it prints) or ``"0,42"``; else
    ``InvalidArgument``."""
    if isinstance(value, TxnID):
        return value
    found = _TXN_TEXT.match(value) if isinstance(value, str) else None
    if found is None:
        raise InvalidArgument(f"not a transaction id: {value!r} (use TC,SEQ such as 0,42, or txn(0,42))")
    tc_id, sequence = (int(x) for x in found.groups() if x is not None)
    return TxnID(tc_id, sequence)


# Topics, subscriptions and stream names share one conservative alphabet: they end up in Ray
# actor names and object-store keys, so no slashes, spaces or dots-only names.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$")
# Stream names of the ledger layer may have path-like segments, each a valid name.
_STREAM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}(/[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}){0,7}$")


def check_name(name: object, what: str = "topic") -> str:
    """Return ``name`` when it is a valid topic or subscription name, else raise
    ``InvalidTopicName``."""
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
        raise InvalidTopicName(f"invalid {what} name {name!r}: use 1-200 of [A-Za-z0-9_.-], "
                               "starting with a letter or digit")
    return name


def check_stream_name(name: object) -> str:
    """Return ``name`` when it is a valid ledger stream name (``a/b/c`` of valid names)."""
    if not isinstance(name, str) or not _STREAM.match(name) or ".." in name:
        raise InvalidTopicName(f"invalid stream name {name!r}")
    return name


# --- Ray actor names (namespace NAMESPACE): a driver finds every actor by name -----------------

# principals (auth) and the per-topic actions they may be granted
PRODUCE = "produce"
CONSUME = "consume"
ACTIONS = (PRODUCE, CONSUME)
_PRINCIPAL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$")


def check_principal(name: object) -> str:
    if not isinstance(name, str) or not _PRINCIPAL.match(name):
        raise InvalidArgument(f"a principal is 1-128 of [A-Za-z0-9._@-] starting alphanumeric, got {name!r}")
    return name


def check_actions(actions: Iterable[str]) -> tuple[str, ...]:
    chosen = tuple(sorted(set(actions)))
    if not chosen or any(a not in ACTIONS for a in chosen):
        raise InvalidArgument(f"actions must be a non-empty subset of {ACTIONS}, got {list(actions)!r}")
    return chosen


NAMESPACE = "raytxn"
SUPERVISOR_NAME = "supervisor"


def host_actor_name(index: int) -> str:
    return f"host-{index}"


def host_for(actor_name: str, hosts: int) -> str:
    """The host that serves ``actor_name`` when there are ``hosts`` of them (``actor_hosts``)."""
    return host_actor_name(stable_hash(actor_name) % hosts)


def coordinator_actor_name(tc_id: int) -> str:
    return f"tc-{tc_id}"


def partition_actor_name(topic: str, partition: int) -> str:
    return f"partition-{topic}-{partition}"


def partition_stream(topic: str, partition: int) -> str:
    """The managed-ledger stream of partition ``partition`` of ``topic``."""
    return f"topics/{topic}/{partition}"


def subscription_actor_name(topic: str, partition: int, subscription: str) -> str:
    return f"sub-{topic}-{partition}-{subscription}"


def activated_on_demand(actor_name: str) -> bool:
    """Partitions and subscriptions start on first use and are passivated when idle; the
    supervisor and the coordinators always run."""
    return actor_name.startswith(("partition-", "sub-"))
