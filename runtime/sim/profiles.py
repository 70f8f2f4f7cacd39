"""Fault profiles of ``raytxn sim --faults``: how often storage, the network and processes fail
while faults are on (the first ``fault_window_s`` of simulated time), before the quiet period,
and the workload they run (the driver's default, but for the profiles made for one workload)."""

from __future__ import annotations

from dataclasses import dataclass, field

from raytxn.sim.driver import Workload
from raytxn.sim.network import NetworkFaults
from raytxn.sim.storage import StorageFaults
from raytxn.sim.world import CrashFaults


@dataclass(frozen=True)
class Profile:
    storage: StorageFaults
    network: NetworkFaults
    crashes: CrashFaults
    fault_window_s: float = 3.0
    workload: Workload = field(default_factory=Workload)
    # The coordinators' table of ended txns' outcomes (CoordinatorConfig.max_recent_outcomes);
    # None: the default, which a run of about 100 txns never fills.
    max_recent_outcomes: int | None = None


_DEFAULT_STORAGE = StorageFaults(put_fail=0.01, put_reply_lost=0.005, get_fail=0.01, slow=0.01)
_DEFAULT_NETWORK = NetworkFaults(drop=0.01, reply_lost=0.01, duplicate=0.01)
_DEFAULT_CRASHES = CrashFaults(mean_interval_s=0.5, zombie=0.25)


def _default_faults_running(workload: Workload) -> Profile:
    """default's faults, running another workload."""
    return Profile(_DEFAULT_STORAGE, _DEFAULT_NETWORK, _DEFAULT_CRASHES, workload=workload)


PROFILES: dict[str, Profile] = {
    "none": Profile(StorageFaults(), NetworkFaults(), CrashFaults()),
    "default": Profile(_DEFAULT_STORAGE, _DEFAULT_NETWORK, _DEFAULT_CRASHES),
    "heavy": Profile(
        StorageFaults(put_fail=0.05, put_reply_lost=0.03, get_fail=0.05, slow=0.05),
        NetworkFaults(drop=0.05, reply_lost=0.03, duplicate=0.05),
        CrashFaults(mean_interval_s=0.15, zombie=0.4),
        fault_window_s=5.0,
    ),
    # default's faults, and references that keep reaching a zombie until a call through them fails
    # (see network.py): finds the zombie-partition commit loss reported in tests/unit/test_sim.py.
    "stale-handles": Profile(
        StorageFaults(put_fail=0.01, put_reply_lost=0.005, get_fail=0.01, slow=0.01),
        NetworkFaults(drop=0.01, reply_lost=0.01, duplicate=0.01, stale_handles=True),
        CrashFaults(mean_interval_s=0.5, zombie=0.25),
    ),
    # default's faults, the pipeline consumed by Exclusive consumers taking turns with cumulative
    # acks (workloads.py): finds bug 1149ba3 (raytxn.testing_bugs "consumer_swap_loss"). No
    # duplicated calls: a late duplicate of a closed consumer's subscribe would attach it again
    # and hold the Exclusive subscription until its consumer timeout (Ray never delivers a call
    # twice; the network's duplicates stand for a client's retries, see network.py). Some turns
    # leave their txn open (forget): its timeout gives messages back after a successor got later
    # ones (the cumulative-ack loss in tests/unit/test_sim_bugs.py, fixed). A turn's txn moves
    # several inputs, so the pipeline has more inputs here, and the tid producers more txns: a
    # seed runs 90-140 txns, about 120 (66 with the default workload, some seeds under 50).
    "consumer-swap": Profile(
        StorageFaults(put_fail=0.01, put_reply_lost=0.005, get_fail=0.01, slow=0.01),
        NetworkFaults(drop=0.01, reply_lost=0.01),
        CrashFaults(mean_interval_s=0.5, zombie=0.25),
        workload=Workload(exclusive_turns=True, inputs=84, tid_txns=36),
    ),
    # default's faults and topics deleted under open txns (workloads.py): finds bug f49da2f
    # (raytxn.testing_bugs "deleted_topic_stuck").
    "topic-delete": _default_faults_running(Workload(doomed_topics=2)),
    # default's faults, and workers that commit with commit_and_begin and run their next txn in
    # the one it began (runtime/client/txn_chain.py): a begin inside the COMMITTING entry, replayed
    # and compacted with it; a chained txn taken, registering what it lacks, or aborted unused.
    "chained": _default_faults_running(Workload(chain_begin=True)),
    # default's faults, and producers of the real client class with appends pipelined
    # (max_in_flight 5) whose client processes crash (pipelined.py): each producer's messages are
    # stored once, in the order they were sent, every acknowledged one.
    "pipelined": _default_faults_running(Workload(pipelined_producers=2, pipelined_messages=100, client_crash=0.5)),
    # pipelined, with more client crashes and every successor started at once, while the dead
    # client's appends are still in the network: its producer epoch must fence them (raytxn.testing_bugs
    # "no_producer_epochs" brings back the collision that epochs closed).
    # Requests outlive their callers here, as Ray actor calls already sent do, and a tenth of the
    # legs are slow (5-50 ms), so a dead client's request can arrive after its successor's first.
    "zombie-appends": Profile(_DEFAULT_STORAGE,
                              NetworkFaults(drop=0.01, reply_lost=0.01, duplicate=0.01,
                                            requests_outlive_callers=True, slow=0.1),
                              _DEFAULT_CRASHES,
                              workload=Workload(pipelined_producers=2, pipelined_messages=100, client_crash=0.8,
                                                client_restart_at_once=1.0)),
    # default's faults, and holders of range leases consuming the output (where the txns write)
    # on a subscription of their own (leases.py): grant, read from storage with the aborted
    # spans, ack in a txn, release, renew, expire, takeover by a newer epoch. The holders run a txn
    # per lease, about one per message of the output, so the pipeline and the tid producers run
    # a bit over half the default's txns: a seed runs about 115 txns in all, as the other
    # profiles' run 105 (205 with the default workload, which made a leases seed cost two).
    "leases": _default_faults_running(Workload(lease_holders=2, inputs=32, tid_txns=10)),
    # default's faults, keyed inputs consumed through Key_Shared subscriptions by workers that
    # join late and leave and come back (keyshared.py): per key, first deliveries in order and
    # no two consumers holding a key's messages at once.
    "key-shared": _default_faults_running(Workload(key_shared=True, workers=3)),
    # default's faults, and half the nemesis' events on partitions and subscriptions are
    # passivations (world.py): the final snapshot, the stop, the kill and the activation.
    "passivation": Profile(_DEFAULT_STORAGE, _DEFAULT_NETWORK,
                           CrashFaults(mean_interval_s=0.3, zombie=0.25, passivate=0.5)),
    # Calls that arrive long after their callers gave up on them: a tenth of the legs take 0.3-2 s
    # (about a txn's timeout) and a request outlives its caller, as a Ray call queued behind a
    # busy or restarting actor does. So an ack or an append may land after its txn ended, or at a
    # successor of the incarnation its end reached; the coordinators remember only 2 outcomes, so
    # a subscription that asks about such a txn (its stale-txn check) may hear that its
    # coordinator forgot it, and must then go by the low watermark (protocol/stale_txns.py).
    "late-requests": Profile(_DEFAULT_STORAGE,
                             NetworkFaults(drop=0.01, reply_lost=0.01, duplicate=0.01,
                                           requests_outlive_callers=True, slow=0.1, slow_latency_s=(0.3, 2.0)),
                             CrashFaults(mean_interval_s=0.3, zombie=0.3), max_recent_outcomes=2),
    # chained, with commits answered once COMMITTING is logged (CoordinatorConfig.commit_answer,
    # Kafka's EndTxn): a worker's next txn appends and acks while the markers of the one before
    # are still on their way, and a coordinator that crashes after the answer re-drives them.
    "early-answer": _default_faults_running(Workload(chain_begin=True, commit_answer="logged")),
    # default's faults on a compacted topic written by keyed txn writers (committed, aborted, left
    # open, fenced) and plain ones resending, with tombstones; its partitions compact themselves
    # past a small threshold while compactions from outside, some dying mid-way, race them
    # (compaction.py). No pipeline: the crashes fall on the compacted topic's actors and the
    # coordinators. Checked: every generation published holds the fold of the committed history
    # up to its horizon and nothing aborted or open, the tables and the final compacted view plus
    # tail equal that fold, fenced txns show nothing.
    "compaction": _default_faults_running(Workload(pipeline=False, compaction=True, tid_producers=3, tid_txns=34)),
    # default's faults and a pipeline keeping per-key counts in a compacted state topic, committing
    # outputs, state updates and input acks in one txn (StatefulPipeline's rule), its
    # incarnations crashing at every point of a batch and left as zombies, some batches aborted
    # (stateful.py). Checked: each key's state counts its committed inputs exactly, every
    # committed batch read the state as of exactly the inputs before it, the output holds each
    # input once. 480 inputs make about 100 batches; the fault window is twice default's, so that a
    # third of them run in it. The coordinators answer commits once logged (early-answer's
    # setting), and the pipeline's own commits, as StatefulPipeline's, ask to be answered once
    # applied: its next batch reads what they wrote.
    "stateful": Profile(_DEFAULT_STORAGE, _DEFAULT_NETWORK, _DEFAULT_CRASHES, fault_window_s=6.0,
                        workload=Workload(pipeline=False, stateful=True, inputs=480, commit_answer="logged")),
}

# ``--faults all``: each seed runs one of the faulty profiles in turn (seed modulo their number),
# so one long run covers every kind of fault and workload; a failing seed's replay command names
# the profile it ran.
ALL_PROFILES = "all"
_ROTATION = tuple(name for name in PROFILES if name != "none")


def profile_of_seed(profile_name: str, seed: int) -> str:
    """The profile ``seed`` runs under ``profile_name`` (itself, but for ``all``)."""
    return _ROTATION[seed % len(_ROTATION)] if profile_name == ALL_PROFILES else profile_name
