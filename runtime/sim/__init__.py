"""Deterministic simulation of the engine (issue 16): the real coordinator, partition and
subscription actor classes, without Ray, on one seeded virtual-time event loop.

- ``loop.py``: the event loop (virtual clock, tasks tagged by simulated process);
- ``storage.py``: in-memory object storage with seeded latency and faults;
- ``network.py``: the ``ActorRef`` the actors get through their ``actor_refs`` seam (delay,
  reorder, drop, lost reply, duplicate);
- ``world.py``: the actor processes, crashes, restarts and zombies;
- ``driver.py``: the workload (producers, fenced transactional producers, consume-transform-produce);
- ``workloads.py``, ``pipelined.py``, ``leases.py``, ``keyshared.py``: workloads some profiles add
  (Exclusive consumers taking turns, deleted topics; the real ``Producer`` with pipelined appends
  and crashing client processes; range leases read from storage and acked in txns; keyed inputs
  through Key_Shared consumers that come and go);
- ``run.py``: one seed -> a verdict and a trace hash (the same seed gives the same trace);
- ``profiles.py``: the fault profiles of ``raytxn sim --faults``;
- ``gate.py``: which drawn faults take effect (all, unless a schedule masks or caps them);
- ``schedule.py``: a smaller run of a seed, as the ``--schedule`` string;
- ``shrink.py``: the smallest schedule found that still fails the same way (``--shrink``).

``raytxn sim --seeds N [--seed S] [--faults PROFILE] [-j J] [--shrink]`` runs seeds and prints one
line per failing seed with the command that replays it (and, with ``--shrink``, the smallest
failing run found, with its own).
"""
