"""Key_Shared consumption (``Workload.key_shared``; the "key-shared" profile): the pipeline's
input carries keys, and the workers consume it through Key_Shared subscriptions, joining late
and leaving and coming back now and then, so keys move between consumers while earlier messages of
theirs are still outstanding (the dispatcher's draining rule, ``raytxn.protocol.dispatch``).

The driver logs, per worker, what it received, acked (individually, in a txn), gave back
(``redeliver``), and when it closed or was told the subscription forgot it (``KeyLog``). Judged
(``violations``), per key of the input (a key lives on one partition), on top of the exactly-once
checker and its per-consumer order check:

- **order**: the first deliveries of a key's messages (over all consumers, in the order they
  were received) follow their positions: a later message of a key never reaches anyone before an
  earlier one did;
- **exclusivity**: when a consumer receives a message of a key, no other consumer holds a
  different message of that key still outstanding: received by it, and neither acked, given back,
  nor released by its closing, nor acked in a committed txn by anyone (a consumer still holding a
  message from before a restart may ack it in a txn after the new incarnation handed it on;
  once that commits, the message is consumed, and its other holder can no longer commit it),
  with no restart of the subscription's actor since it was received
  (a restart forgets every consumer, and the new incarnation hands everything out again), and
  handed out by the same incarnation (a zombie incarnation answering a fetch after its successor
  started hands out what its successor never knew was out: the same forgetting as a restart, the
  receipt just lands after it; each fetch reply names its incarnation in ``generation``).
  Conservative: an ack or a give-back counts from the moment the worker makes the call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raytxn.client.message import MessageId

KEYS = 7   # keys of the input


@dataclass
class KeyLog:
    # ("recv", consumer, id, uid, t, incarnation), ("ack" or "release", consumer, id, None, t, None),
    # ("reset", consumer, partition, None, t, None)
    events: list[tuple] = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)  # input uid -> its key

    def received(self, consumer: str, mid: MessageId, uid: str, t: float, incarnation: int | None = None) -> None:
        """``incarnation``: of the subscription actor that handed the message out (None: unknown)."""
        self.events.append(("recv", consumer, mid, uid, t, incarnation))

    def acked(self, consumer: str, mid: MessageId, t: float) -> None:
        self.events.append(("ack", consumer, mid, None, t, None))

    def released(self, consumer: str, mid: MessageId, t: float) -> None:
        self.events.append(("release", consumer, mid, None, t, None))

    def settled(self, mid: MessageId, t: float) -> None:
        """``mid`` was acked in a txn whose commit was asked for at ``t`` and went through: from
        then on nobody holds it, whoever received it last (a consumer still processing it can
        no longer commit it)."""
        self.events.append(("settled", None, mid, None, t, None))

    def reset(self, consumer: str, partition: int | None, t: float) -> None:
        """``consumer`` closed, or learned that the subscription forgot it (on ``partition``;
        None: all)."""
        self.events.append(("reset", consumer, partition, None, t, None))


def violations(log: KeyLog, restarts: dict[int, list[float]]) -> list[str]:
    """See the module docstring. ``restarts``: per input partition, when its Key_Shared
    subscription's actor got a new incarnation (zombies included)."""
    found: list[str] = []
    first_seen: dict[MessageId, float] = {}
    last_first: dict[str, tuple[MessageId, str]] = {}   # key -> (highest first-delivered id, uid)
    # key -> id -> (consumer, t, incarnation that handed it out)
    outstanding: dict[str, dict[MessageId, tuple[str, float, int | None]]] = {}
    owner_of: dict[MessageId, str] = {}
    # (stable by time: a commit's "settled" is logged once it is answered, stamped when it was asked for)
    for kind, consumer, what, uid, t, incarnation in sorted(log.events, key=lambda event: event[4]):
        if kind == "recv":
            mid: MessageId = what
            key = log.keys.get(uid, "")
            if mid not in first_seen:
                first_seen[mid] = t
                previous = last_first.get(key)
                if previous is not None and mid < previous[0]:
                    found.append(f"order: key {key}: {uid} ({mid}) first delivered after {previous[1]} "
                                 f"({previous[0]}), to {consumer} at t={t:.3f}")
                else:
                    last_first[key] = (mid, uid)
            held = outstanding.setdefault(key, {})
            for other_mid, (other, since, other_incarnation) in held.items():
                forgotten = (incarnation is not None and other_incarnation is not None
                             and incarnation != other_incarnation) or any(
                    since <= r <= t for r in restarts.get(mid.partition, ()))
                if other != consumer and other_mid != mid and not forgotten:
                    found.append(f"exclusivity: key {key}: {consumer} got {uid} ({mid}) at t={t:.3f} while "
                                 f"{other} held {other_mid} since t={since:.3f}")
                    break
            held[mid] = (consumer, t, incarnation)
            owner_of[mid] = key
        elif kind == "settled":
            key = owner_of.get(what)
            if key is not None:
                outstanding[key].pop(what, None)
        elif kind in ("ack", "release"):
            key = owner_of.get(what)
            if key is not None and outstanding[key].get(what, ("",))[0] == consumer:
                del outstanding[key][what]
        else:  # reset
            for held in outstanding.values():
                for held_mid in [m for m, (c, _, _) in held.items()
                                 if c == consumer and (what is None or m.partition == what)]:
                    del held[held_mid]
        if len(found) >= 3:
            break
    return found
