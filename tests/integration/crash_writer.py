"""A writer process for the crash tests: appends forever with concurrency, printing every
acknowledged append as `ack <ledger> <entry> <tag>`; the test SIGKILLs it at a random moment."""

import asyncio
import json
import sys

from raytxn.ledger import LedgerConfig, ManagedLedger
from raytxn.ledger.storage import Storage


async def main(url: str, options: dict, stream: str, record_size: int, concurrency: int) -> None:
    ml = await ManagedLedger.open(Storage.from_url(url, **options), stream, LedgerConfig(max_delay_ms=1))
    print(f"incarnation {ml.incarnation}", flush=True)
    counter = 0

    async def worker(w: int) -> None:
        nonlocal counter
        while True:
            counter += 1
            tag = f"{ml.incarnation}-{w}-{counter}"
            body = tag.encode() + b":" + bytes([counter % 251]) * record_size
            pos = await ml.append([body])
            print(f"ack {pos.ledger_id} {pos.entry_id} {tag}", flush=True)

    await asyncio.gather(*[worker(w) for w in range(concurrency)])


if __name__ == "__main__":
    url, options, stream, size, conc = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], *map(int, sys.argv[4:6])
    asyncio.run(main(url, options, stream, size, conc))
