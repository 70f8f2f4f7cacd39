"""Authorizing Kafka requests as the connection's raytxn principal, where no single engine actor
would refuse the request before something changed.

Most requests need nothing here: every engine call a request makes carries the connection's own
token, so the partition and subscription actors refuse a produce, fetch, offset lookup or commit
of a principal without the topic's permission (TOPIC_AUTHORIZATION_FAILED, the raytxn error's
text naming the principal), and the coordinators refuse a transactional id or transaction of
another principal (TRANSACTIONAL_ID_AUTHORIZATION_FAILED). What is checked here first:

* JoinGroup: the topics the member's consumer-protocol subscription names need ``consume`` (a
  group's offsets on a topic are a raytxn subscription of it; the join is gateway memory that no
  actor sees); a group whose members are another principal's is refused, so that nobody can
  join, sync, heartbeat, leave or commit in someone else's live group. Both answer
  GROUP_AUTHORIZATION_FAILED. Only the ``consumer`` protocol type is served to non-superusers
  (another type's metadata names no topics to authorize).
* AddPartitionsToTxn: ``produce`` on every topic, before the coordinator registers any partition
  (TOPIC_AUTHORIZATION_FAILED for those topics, OPERATION_NOT_ATTEMPTED for the rest, as Kafka).
* OffsetCommit and TxnOffsetCommit (``send_offsets_to_transaction``): ``consume`` on every topic,
  before a subscription is created or registered with the transaction.
* DeleteGroups deletes subscriptions, which only superusers may: GROUP_AUTHORIZATION_FAILED.

Superusers pass every check, as they pass the actors' checks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from raytxn.ids import CONSUME, PRODUCE
from raytxn.kafka.groups import GroupTable, subscription_topics
from raytxn.kafka.security import (
    GROUP_AUTHORIZATION_FAILED,
    TOPIC_AUTHORIZATION_FAILED,
    Session,
)

MAX_BOUND_GROUPS = 100_000

# ``topic_actions(topics)``: the caller's actions on each existing topic (the supervisor's).
TopicActions = Callable[[list[str]], Awaitable[dict[str, list[str]]]]


@dataclass(frozen=True)
class Refusal:
    """A request refused: the Kafka error, the message naming the principal, and (for a request
    spanning topics) the topics refused, the others answering OPERATION_NOT_ATTEMPTED."""

    code: int
    message: str
    topics: set[str] | None = None


class RequestAuthorizer:
    def __init__(self, topic_actions: TopicActions, groups: GroupTable) -> None:
        self._topic_actions, self._groups = topic_actions, groups
        self._group_principals: dict[str, str] = {}  # live group -> the principal its members are

    async def check(self, api_key: int, request: Any, version: int, session: Session) -> Refusal | None:
        """None when the request may go on as ``session``'s principal, else why not."""
        if not session.auth_on or session.superuser:
            return None
        principal = session.principal
        assert principal is not None
        if api_key == 11:
            return await self._join(request, principal)
        if api_key in (12, 13, 14, 25):  # heartbeat, leave, sync, AddOffsetsToTxn: the group's principal
            return self._group_refusal(request.group_id, principal)
        if api_key in (8, 28):
            refused = self._group_refusal(request.group_id, principal)
            return refused or await self._topics_refusal([t.name for t in request.topics], CONSUME, principal)
        if api_key == 24:
            return await self._topics_refusal([t.name for t in request.v3_and_below_topics], PRODUCE, principal)
        if api_key == 42:
            return Refusal(GROUP_AUTHORIZATION_FAILED,
                           f"{principal!r} may not delete groups: that deletes subscriptions, which superusers do")
        if api_key == 15:
            for group_id in request.groups:
                refused = self._group_refusal(group_id, principal)
                if refused:
                    return refused
        return None

    def _live_members(self, group_id: str) -> bool:
        group = self._groups.groups.get(group_id)
        return group is not None and bool(group.members)

    def _group_refusal(self, group_id: object, principal: str) -> Refusal | None:
        if not isinstance(group_id, str):
            return None  # the handler answers INVALID_GROUP_ID
        owner = self._group_principals.get(group_id)
        if owner is None or owner == principal or not self._live_members(group_id):
            return None
        return Refusal(GROUP_AUTHORIZATION_FAILED,
                       f"group {group_id!r} has members of principal {owner!r}, not {principal!r}")

    async def _join(self, request: Any, principal: str) -> Refusal | None:
        group_id = request.group_id
        refused = self._group_refusal(group_id, principal)
        if refused:
            return refused
        if request.protocol_type != "consumer":
            return Refusal(GROUP_AUTHORIZATION_FAILED,
                           f"{principal!r}: only consumer groups are served (not {request.protocol_type!r})")
        topics: set[str] = set()
        for protocol in request.protocols:
            named = subscription_topics(bytes(protocol.metadata))
            if named is None:
                return Refusal(GROUP_AUTHORIZATION_FAILED,
                               f"{principal!r}: the subscription of protocol {protocol.name!r} cannot be read")
            topics.update(named)
        refused = await self._topics_refusal(sorted(topics), CONSUME, principal)
        if refused:
            return Refusal(GROUP_AUTHORIZATION_FAILED, refused.message)
        if isinstance(group_id, str):
            self._bind(group_id, principal)
        return None

    def _bind(self, group_id: str, principal: str) -> None:
        if len(self._group_principals) >= MAX_BOUND_GROUPS:  # forget the groups without members
            self._group_principals = {g: p for g, p in self._group_principals.items() if self._live_members(g)}
            if len(self._group_principals) >= MAX_BOUND_GROUPS:
                self._group_principals.clear()
        self._group_principals[group_id] = principal

    async def _topics_refusal(self, topics: list[str], action: str, principal: str) -> Refusal | None:
        if not topics:
            return None
        actions = await self._topic_actions(list(dict.fromkeys(topics)))
        refused = {t for t in topics if t in actions and action not in actions[t]}
        if not refused:
            return None
        names = ", ".join(repr(t) for t in sorted(refused))
        return Refusal(TOPIC_AUTHORIZATION_FAILED, f"{principal!r} has no {action} permission on topic {names}",
                       refused)
