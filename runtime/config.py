"""Configuration of the engine's actors. Plain dataclasses: they pickle to actors as they are."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from raytxn.auth import AuthConfig
from raytxn.errors import InvalidArgument
from raytxn.ledger import LedgerConfig

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: object) -> float:
    """Seconds of a duration as operators write it: ``"30s"``, ``"5m"``, ``"1h"``, ``"250ms"``,
    ``"2d"`` or plain seconds (a number, or a string without a unit); ``InvalidArgument`` for
    anything else (negative, not finite, an unknown unit)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        found = _DURATION.match(value) if isinstance(value, str) else None
        if found is None:
            raise InvalidArgument(f"not a duration: {value!r} (use e.g. 30s, 5m, 1h, 250ms, or seconds)")
        seconds = float(found.group(1)) * _UNIT_S[found.group(2) or "s"]
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidArgument(f"a duration must be a finite number of seconds >= 0, got {value!r}")
    return seconds


COMMIT_ANSWERS = ("applied", "logged")  # CoordinatorConfig.commit_answer


@dataclass
class CoordinatorConfig:
    num_coordinators: int = 2
    default_timeout_ms: int = 60_000
    max_timeout_ms: int = 15 * 60 * 1000        # Kafka's transaction.max.timeout.ms
    max_recent_outcomes: int = 100_000          # ended txns whose outcome a retried end still gets
    # Clients begin their next txn with each commit (client/txn_chain.py); an unused one is
    # released without an end to its participants, so it leaves nothing on them.
    chain_begin: bool = True
    # The transaction log's batched writer: records of concurrent requests share one put, by
    # count, bytes and delay. `batched_log=False` puts every record on its own (for comparison).
    batched_log: bool = True
    log_max_delay_ms: float = 0.0
    log_max_batch_bytes: int = 1 << 20
    log_max_batch_records: int = 1000
    # After this many log entries the live state is written anew and the log below it trimmed.
    compact_after_entries: int = 10_000
    end_retry_backoff_s: tuple[float, float] = (0.02, 1.0)
    # A txn whose end a participant refused is driven again this often: the refusal may pass
    # (a participant whose start failed restarts after its hold-off).
    stalled_end_retry_s: float = 5.0
    # Live transactions older than this count as slow (the raytxn_slow_txns gauge, set this often).
    slow_txn_threshold_ms: int = 60_000
    slow_txn_report_s: float = 1.0
    # When a commit is answered. "applied" (Pulsar's): once every participant has its marker, so
    # a read right after the answer sees the txn's messages. "logged" (Kafka's EndTxn): once
    # COMMITTING is in the log, the decision durable; the markers follow from the driver, as a
    # recovering coordinator's re-drive sends them, so the answer saves a participant round trip
    # and a put, and the txn's messages become readable a moment after it. Aborts are always
    # answered once applied: a caller may redo the aborted work at once.
    commit_answer: str = "applied"
    # A txn's last record (COMMITTED/ABORTED) waits up to this long to ride with the next log
    # put rather than cost one of its own (the coordinator's docstring says why that is safe); 0 logs
    # each at once.
    complete_linger_ms: float = 50.0

    def __post_init__(self) -> None:
        if self.commit_answer not in COMMIT_ANSWERS:
            raise InvalidArgument(f"commit_answer must be one of {', '.join(COMMIT_ANSWERS)}, "
                                  f"not {self.commit_answer!r}")
        if not self.complete_linger_ms >= 0:  # also refuses NaN
            raise InvalidArgument(f"complete_linger_ms must be >= 0, not {self.complete_linger_ms!r}")

    def log_config(self) -> LedgerConfig:
        # No read cache: a ledger keeps every object it writes, decoded, for readers of its tail
        # (up to cache_bytes of encoded size, several times that in Python objects, until a trim),
        # but a coordinator reads its log only when it starts, replaying each object once. With
        # the default cache its process grew by every entry logged since the last compaction
        # (10,000 entries apart: half an hour at the soak's rate), about 1 MiB a minute.
        return LedgerConfig(group_commit=self.batched_log, max_delay_ms=self.log_max_delay_ms,
                            max_batch_bytes=self.log_max_batch_bytes,
                            max_batch_entries=self.log_max_batch_records, cache_bytes=0)


@dataclass
class PartitionConfig:
    max_message_bytes: int = 5 << 20            # Pulsar's default maxMessageSize
    snapshot_every_txns: int = 1000              # snapshot after this many ended txns...
    snapshot_interval_s: float = 60.0            # ...or this long after a change
    snapshot_segment_bytes: int = 256 << 10      # larger snapshots are split into segments
    dangling_check_s: float = 5.0                # re-check ongoing txns against watermarks
    retention_check_s: float = 60.0              # trim below the subscriptions' cursors this often
    max_read_entries: int = 1000


# A consumer's receive queue per partition (raytxn/client/consumer.py says why these sizes).
RECEIVER_QUEUE_SIZE = 20_000
RECEIVER_QUEUE_BYTES = 8 << 20


@dataclass
class SubscriptionConfig:
    receiver_queue_size: int = RECEIVER_QUEUE_SIZE    # a consumer's default receive queue per partition:
    receiver_queue_bytes: int = RECEIVER_QUEUE_BYTES  # this many messages, and about this many bytes
    ack_timeout_s: float | None = None         # redeliver unacked messages after this (None: never)
    negative_ack_redelivery_delay_s: float = 1.0
    max_index_lag: int = 100                   # pending-ack log index: one entry per this many records
    cursor_snapshot_interval_s: float = 1.0    # persist the cursor at most this often
    trim_interval_s: float = 5.0               # trim the pending-ack log on this timer too
    consumer_timeout_s: float = 30.0           # a consumer neither fetching nor pinging this long is dropped
    read_ahead_messages: int = 2000            # messages read from the partition ahead of dispatch...
    max_read_ahead_messages: int = 20_000      # ...or as many as consumers' fetches ask for, up to this
    read_batch_entries: int = 200              # entries per partition read
    read_wait_s: float = 5.0                   # a partition read long-polls this long for new data
    stale_txn_check_s: float = 5.0             # a txn pending here this long is asked about at its coordinator
    # While consumers are attached or a lease is held, the backlog in messages is counted this
    # often and set on the raytxn_subscription_backlog_messages gauge (one bounded read of the
    # partition's entry headers). None: only when stats(backlog=True) is asked.
    backlog_metric_interval_s: float | None = 10.0

    def log_config(self) -> LedgerConfig:
        # No read cache, as the coordinator's log (CoordinatorConfig.log_config): a ledger keeps the
        # objects it writes and replays, decoded, for readers of its tail, until a trim; but a
        # subscription reads its pending-ack log only when it starts. Kept, they grew its process
        # between trims (the soak's subscriptions: up to 1.2 MiB a minute).
        return LedgerConfig(cache_bytes=0)

    def __post_init__(self) -> None:
        seconds = self.stale_txn_check_s
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds < math.inf:
            raise InvalidArgument(f"stale_txn_check_s must be a number of seconds > 0, not {seconds!r}")


@dataclass
class EngineConfig:
    """Everything a cluster is configured with; handed to every actor it creates."""

    storage_url: str = "file://./.raytxn-data"
    storage_options: dict[str, object] = field(default_factory=dict)
    # Ray custom resources every engine actor asks for (e.g. {"raytxn": 0.01}): pins the engine to
    # the nodes that offer them. Empty: anywhere.
    actor_resources: dict[str, float] = field(default_factory=dict)
    watch_interval_s: float = 1.0     # the supervisor probes every actor this often
    watch_timeout_s: float = 10.0     # a probe unanswered this long reports RECOVERING
    # Live partitions and subscriptions found ALIVE are probed at most this many per watch round,
    # least recently probed first (coordinators and actors not known ALIVE: every round). A probe
    # is an actor call, and probing 130 actors every second cost more CPU than they used idle.
    max_probes_per_watch: int = 32
    # Partition and subscription actors idle this long (no call, no open txn, no consumer) are
    # passivated: their process stops, and the next call starts it again. None: never.
    passivate_idle_s: float | None = 300.0
    # Ray memory every actor the supervisor starts reserves, so a node's actors never
    # over-subscribe its memory (a raytxn actor's process holds 65-71 MiB). 0: reserve none.
    actor_memory_mib: int = 72
    # How long a new actor may take to start before the caller is told it is unavailable.
    actor_start_timeout_s: float = 120.0
    # Ray's scheduling strategy for engine actors: "SPREAD" balances coordinators, partitions and
    # subscriptions over the nodes that may host them (Ray's "DEFAULT" packs them near their
    # creator, the supervisor).
    actor_placement: str = "SPREAD"
    # Hosts: shared processes that serve partitions and subscriptions, many per process, as a
    # broker does (actors/host.py). 0: each partition and subscription actor is a process of its
    # own. With hosts, an activation starts no process, and idle actors cost no process at all.
    actor_hosts: int = 0
    max_hosted_actors: int = 5000  # actors one host serves at most at once
    host_memory_mib: int = 1024    # Ray memory a host reserves
    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    subscription: SubscriptionConfig = field(default_factory=SubscriptionConfig)
    # Tokens and permissions: on when ``auth.secret`` is set (see runtime/auth.py).
    auth: AuthConfig = field(default_factory=AuthConfig)

    def public(self) -> EngineConfig:
        """This config as clients see it: without the auth secret."""
        from dataclasses import replace

        return replace(self, auth=self.auth.public())
