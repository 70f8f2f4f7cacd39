"""The host's bookkeeping (actors/host.py) without Ray: every task a hosted actor creates is its
own, a drop cancels them all and stops the actor, and a full host refuses a new actor."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from raytxn.actors.host import ActorHost
from raytxn.auth import AuthConfig
from raytxn.config import PartitionConfig, SubscriptionConfig
from raytxn.errors import ActorUnavailable, CannotPlaceActor, InvalidArgument
from raytxn.ids import partition_actor_name


def new_host(max_hosted: int = 10) -> ActorHost:
    return ActorHost("host-0", f"memory://{uuid.uuid4().hex}", {}, PartitionConfig(), SubscriptionConfig(),
                     AuthConfig(), max_hosted)


def test_a_dropped_actor_loses_every_task_it_created_and_stops_serving() -> None:
    async def run() -> None:
        host = new_host()
        names = [partition_actor_name("t", p) for p in range(3)]
        for p, name in enumerate(names):
            answer = await host.start("partition", name, ["t", p])
            assert answer["hosted_now"] and answer["incarnation"] >= 1
        assert (await host.start("partition", names[0], ["t", 0]))["hosted_now"] is False  # already serving
        owned = {name: row["tasks"] for name, row in (await host.hosted()).items()}
        assert all(count >= 1 for count in owned.values()), owned  # its timers at least
        tasks = set(host._tasks[id(host._hosted[names[0]])])
        dropped = host._hosted[names[0]]
        assert await host.drop(names[0]) is True
        await asyncio.sleep(0)
        assert all(task.cancelled() or task.done() for task in tasks)
        assert names[0] not in await host.hosted()
        assert (await host.ready())["owned_tasks"] == sum(owned[n] for n in names[1:])
        with pytest.raises(ActorUnavailable):
            await host.call(names[0], "ready", (), {})  # not hosted now: the caller asks again
        with pytest.raises(ActorUnavailable):
            await dropped.ready()  # a call still holding the dropped actor gets a retriable error
        assert await host.drop(names[0]) is False
        for name in names[1:]:
            await host.drop(name)
        assert (await host.ready())["owned_tasks"] == 0

    asyncio.run(run())


def test_a_full_host_and_a_wrong_spec_are_refused_and_change_nothing() -> None:
    async def run() -> None:
        host = new_host(max_hosted=1)
        await host.start("partition", partition_actor_name("t", 0), ["t", 0])
        with pytest.raises(CannotPlaceActor):
            await host.start("partition", partition_actor_name("t", 1), ["t", 1])
        with pytest.raises(InvalidArgument):
            await host.start("coordinator", "coordinator-0", [0])
        with pytest.raises(InvalidArgument):
            await host.call(partition_actor_name("t", 0), "_start", (), {})
        assert list(await host.hosted()) == [partition_actor_name("t", 0)]
        await host.drop(partition_actor_name("t", 0))
        host.max_hosted = 2
        with pytest.raises(InvalidArgument):  # the name must be the one the args make
            await host.start("partition", partition_actor_name("t", 5), ["t", 1])
        assert await host.hosted() == {}

    asyncio.run(run())
