"""JoinGroup, SyncGroup, Heartbeat and LeaveGroup: the gateway's handlers around the pure group
state machine (``groups.GroupTable``), whose state is in this gateway's memory only.

A JoinGroup or SyncGroup whose answer is not ready waits on a future keyed by (group, kind,
member) until the table hands the answer out: when another member's call completes the join, the
leader's SyncGroup brings the assignment, or ``tick`` (the gateway calls it every ``TICK_S``)
finds a rebalance timeout passed or a session expired. A wait is bounded by the member's
rebalance timeout plus ``WAIT_SLACK_S``; past it the call is answered REBALANCE_IN_PROGRESS and the
table told (``abandon``). A newer call of the same member for the same thing answers the older
one the same way.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from kafka.protocol.consumer import JoinGroupResponse, LeaveGroupResponse

from raytxn.errors import InvalidTopicName
from raytxn.kafka import groups, mapping, wire
from raytxn.kafka.groups import GroupTable, JoinAnswer, SyncAnswer

TICK_S = 0.25
WAIT_SLACK_S = 5.0


def group_id_error(group_id: object) -> int:
    """INVALID_GROUP_ID for a group id that cannot name a raytxn subscription, else NONE."""
    try:
        mapping.raytxn_subscription(group_id)
    except InvalidTopicName:
        return wire.INVALID_GROUP_ID
    return wire.NONE


def join_fields(answer: JoinAnswer, version: int) -> dict[str, Any]:
    member = JoinGroupResponse.JoinGroupResponseMember
    return {"throttle_time_ms": 0, "error_code": answer.error, "generation_id": answer.generation,
            "protocol_type": answer.protocol_type,
            # protocol_name is nullable from v7 only
            "protocol_name": answer.protocol_name if version >= 7 else answer.protocol_name or "",
            "leader": answer.leader, "skip_assignment": False, "member_id": answer.member_id,
            "members": [member(member_id=m, group_instance_id=instance, metadata=meta)
                        for (m, meta), instance in zip(answer.members, answer.instances or [None] * len(answer.members),
                                                       strict=True)]}


def instance_of(request: Any, version: int, since: int) -> str | None:
    """The request's ``group_instance_id`` (static membership), in versions that carry it."""
    return request.group_instance_id if version >= since else None


def sync_fields(answer: SyncAnswer) -> dict[str, Any]:
    return {"throttle_time_ms": 0, "error_code": answer.error, "protocol_type": answer.protocol_type,
            "protocol_name": answer.protocol_name, "assignment": answer.assignment}


class GroupMembership:
    def __init__(self, table: GroupTable | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.table = table if table is not None else GroupTable()
        self._clock = clock
        self._waiting: dict[tuple[str, str, str], asyncio.Future] = {}  # at most one per member and kind

    def tick(self) -> None:
        """Expire members and complete overdue joins; hand out the answers that became ready."""
        self.table.tick(self._clock())
        self._deliver()

    def hand_off(self, group_id: str, error: int) -> None:
        """``GroupTable.hand_off``, and the waiting calls answered."""
        self.table.hand_off(group_id, error)
        self._deliver()

    def _deliver(self) -> None:
        for ready in self.table.take_answers():
            future = self._waiting.pop((ready.group_id, ready.kind, ready.member_id), None)
            if future is not None and not future.done():
                future.set_result(ready.answer)

    async def _answer(self, key: tuple[str, str, str], call: Callable[[], Any], wait_s: float, gave_up: Any) -> Any:
        """``call``'s answer, or the one the table hands out for ``key`` later (``gave_up``
        after ``wait_s``). Answers time made due go out first, to the calls made before this one
        (the member's own earlier call among them); an earlier call still waiting is replaced."""
        self.table.expire(key[0], self._clock())
        self._deliver()
        older = self._waiting.pop(key, None)
        if older is not None and not older.done():
            older.set_result(gave_up)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiting[key] = future  # before the call: the call itself may complete the wait
        try:
            answer = call()
            self._deliver()
            if answer is not None:
                return answer
            try:
                return await asyncio.wait_for(asyncio.shield(future), wait_s)
            except TimeoutError:
                self.table.abandon(key[0], key[1], key[2])
                return gave_up
        finally:
            if self._waiting.get(key) is future:
                del self._waiting[key]

    # --- handlers ----------------------------------------------------------------------------

    async def join_group(self, request: Any, version: int, client_id: str | None,
                         client_host: str = "") -> dict[str, Any]:
        group_id, member_id = request.group_id, request.member_id
        error = group_id_error(group_id)
        instance_id = instance_of(request, version, 5)
        if error == wire.NONE and instance_id is not None and group_id_error(instance_id) != wire.NONE:
            error = wire.INVALID_REQUEST  # an instance id is a name too, bounded the same way
        if error != wire.NONE:
            return join_fields(JoinAnswer(error, member_id), version)
        protocols = tuple((p.name, bytes(p.metadata)) for p in request.protocols)
        rebalance_ms = request.rebalance_timeout_ms if version >= 1 else request.session_timeout_ms
        new_member_id = f"{client_id or 'member'}-{uuid.uuid4()}"

        def call() -> JoinAnswer | None:
            return self.table.join(group_id, member_id, new_member_id, client_id or "", request.protocol_type,
                                   protocols, request.session_timeout_ms, rebalance_ms, self._clock(), instance_id,
                                   client_host)

        key = (group_id, "join", member_id or new_member_id)
        wait_s = max(rebalance_ms, 0) / 1000 + WAIT_SLACK_S
        answer = await self._answer(key, call, wait_s, JoinAnswer(groups.REBALANCE_IN_PROGRESS, key[2]))
        return join_fields(answer, version)

    async def sync_group(self, request: Any, version: int) -> dict[str, Any]:
        group_id, member_id = request.group_id, request.member_id
        error = group_id_error(group_id)
        if error != wire.NONE:
            return sync_fields(SyncAnswer(error))
        assignments = {a.member_id: bytes(a.assignment) for a in request.assignments}
        protocol_type = request.protocol_type if version >= 5 else None
        protocol_name = request.protocol_name if version >= 5 else None
        group = self.table.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        wait_s = (member.rebalance_timeout_ms / 1000 if member is not None else 0) + WAIT_SLACK_S

        def call() -> SyncAnswer | None:
            return self.table.sync(group_id, member_id, request.generation_id, protocol_type, protocol_name,
                                   assignments, self._clock(), instance_of(request, version, 3))

        answer = await self._answer((group_id, "sync", member_id), call, wait_s,
                                    SyncAnswer(groups.REBALANCE_IN_PROGRESS))
        return sync_fields(answer)

    async def heartbeat(self, request: Any, version: int) -> dict[str, Any]:
        error = group_id_error(request.group_id)
        if error == wire.NONE:
            error = self.table.heartbeat(request.group_id, request.member_id, request.generation_id, self._clock(),
                                         instance_of(request, version, 3))
            self._deliver()
        return {"throttle_time_ms": 0, "error_code": error}

    async def leave_group(self, request: Any, version: int) -> dict[str, Any]:
        """v0-2 name one member; v3+ a list (answered member by member)."""
        error = group_id_error(request.group_id)
        member_ids = [request.member_id] if version <= 2 else [m.member_id for m in request.members]
        instance_ids = [None] if version <= 2 else [m.group_instance_id for m in request.members]
        if error != wire.NONE:
            errors = [error for _ in member_ids]
        else:
            errors = self.table.leave(request.group_id, member_ids, self._clock(), instance_ids)
            self._deliver()
        if version <= 2:
            return {"throttle_time_ms": 0, "error_code": errors[0], "members": []}
        members = [LeaveGroupResponse.MemberResponse(member_id=m, group_instance_id=i, error_code=e)
                   for m, i, e in zip(member_ids, instance_ids, errors, strict=True)]
        return {"throttle_time_ms": 0, "error_code": error, "members": members}

    # --- for the offset handlers -------------------------------------------------------------

    def check_commit(self, group_id: str, member_id: str, generation: int, instance_id: str | None = None) -> int:
        error = self.table.check_commit(group_id, member_id, generation, self._clock(), instance_id)
        self._deliver()
        return error

    def check_txn_commit(self, group_id: str, member_id: str, generation: int,
                         instance_id: str | None = None) -> int:
        error = self.table.check_txn_commit(group_id, member_id, generation, self._clock(), instance_id)
        self._deliver()
        return error
