"""The coordinator's log keeps no read cache: it is read only when the coordinator starts, so the
objects it writes are not kept decoded in memory (with the ledger's default cache, a coordinator's
process grew by every entry logged since its last compaction). In the real coordinator class, in
this process on memory storage."""

from __future__ import annotations

import asyncio
import uuid

from raytxn.actors.coordinator import TransactionCoordinator
from raytxn.config import CoordinatorConfig
from raytxn.protocol.txnlog import EndAction

TXNS = 50
CONFIG = CoordinatorConfig(complete_linger_ms=0)  # every entry its own put: one object each


def test_the_coordinators_log_keeps_none_of_the_objects_it_wrote_and_a_restart_still_replays_them() -> None:
    async def main() -> None:
        url = f"memory://log-cache-{uuid.uuid4().hex}"
        tc = TransactionCoordinator(0, url, config=CONFIG)
        ended = []
        for n in range(TXNS):
            txn = await tc.new_txn(60_000, f"owner-{n}")
            action = EndAction.COMMIT if n % 2 == 0 else EndAction.ABORT
            await tc.end_txn(txn, action, f"owner-{n}")
            ended.append((txn, "COMMITTED" if n % 2 == 0 else "ABORTED"))
        await tc.ready()  # the last records are logged
        assert tc._ledger is not None
        assert len(await tc._ledger.stored_objects()) >= 2 * TXNS  # what it would otherwise keep
        assert len(tc._ledger._cache) <= 1  # the ledger keeps at least its last object
        fresh = TransactionCoordinator(0, url, config=CONFIG)  # replays with the same config
        for txn, state in ended:
            assert (await fresh.get_txn(txn))["state"] == state
        assert fresh._ledger is not None and len(fresh._ledger._cache) <= 1

    asyncio.run(main())
