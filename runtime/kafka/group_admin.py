"""The consumer-group admin APIs: ListGroups, DescribeGroups and DeleteGroups (what Kafka's
AdminClient, ``kafka-consumer-groups`` and confluent-kafka's ``list_consumer_groups`` /
``describe_consumer_groups`` / ``delete_consumer_groups`` call).

A Kafka group here is two things (see ``group_offsets``): its membership, in this gateway's
memory (``groups.GroupTable``), and its committed offsets, the raytxn subscriptions named as the
group on each topic. So a group exists while it has members or a subscription, as a Kafka group
exists while it has members or committed offsets: without members it is Empty. That makes every
raytxn subscription a group too (a native consumer's subscription G is group G's offsets).

DeleteGroups deletes the group's subscriptions on every topic, which is how Kafka deletes a
group's committed offsets. It refuses a group with members (NON_EMPTY_GROUP), as Kafka does, and
one with neither members nor subscriptions (GROUP_ID_NOT_FOUND).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from kafka.protocol.admin import DeleteGroupsResponse, DescribeGroupsResponse, ListGroupsResponse

from raytxn.errors import RaytxnError
from raytxn.kafka import mapping, wire
from raytxn.kafka.group_membership import GroupMembership, group_id_error
from raytxn.kafka.groups import GroupState

NON_EMPTY_GROUP = 68
GROUP_ID_NOT_FOUND = 69
MAX_LISTED_GROUPS = 100_000  # a bound on one ListGroups answer (groups of all topics together)

# ``topic_rows()``: the supervisor's topic rows (each with its "subscriptions");
# ``delete_subscription(topic, name)``: delete one subscription.
TopicRows = Callable[[], Awaitable[list[dict[str, Any]]]]
DeleteSubscription = Callable[[str, str], Awaitable[Any]]


class GroupAdmin:
    def __init__(self, membership: GroupMembership, topic_rows: TopicRows,
                 delete_subscription: DeleteSubscription) -> None:
        self.membership = membership
        self._topic_rows, self._delete_subscription = topic_rows, delete_subscription

    async def _offset_topics(self) -> dict[str, list[str]]:
        """Group id -> the topics it has a subscription (committed offsets) on."""
        topics: dict[str, list[str]] = {}
        for row in await self._topic_rows():
            for name in row["subscriptions"]:
                topics.setdefault(name, []).append(row["name"])
        return topics

    async def list_groups(self, request: Any, version: int) -> dict[str, Any]:
        """Every group with members or committed offsets; v4+ may filter by state."""
        wanted = {s.lower() for s in request.states_filter} if version >= 4 and request.states_filter else None
        try:
            offsets = await self._offset_topics()
        except RaytxnError as e:
            return {"throttle_time_ms": 0, "error_code": mapping.error_code(e), "groups": []}
        table = self.membership.table.groups
        states = {group_id: str(GroupState.EMPTY) for group_id in offsets}
        states.update({group_id: str(group.state) for group_id, group in table.items()})
        listed = []
        for group_id in sorted(states)[:MAX_LISTED_GROUPS]:
            if wanted is not None and states[group_id].lower() not in wanted:
                continue
            active = table.get(group_id)
            protocol_type = (active.protocol_type if active is not None else None) or "consumer"
            listed.append(ListGroupsResponse.ListedGroup(group_id=group_id, protocol_type=protocol_type,
                                                         group_state=states[group_id]))
        return {"throttle_time_ms": 0, "error_code": wire.NONE, "groups": listed}

    async def describe_groups(self, request: Any, version: int) -> dict[str, Any]:
        """Each group's state, protocol and members (their metadata and assignment); a group
        with committed offsets only is Empty, one with neither Dead (Kafka's answers)."""
        try:
            offsets = await self._offset_topics()
        except RaytxnError as e:
            offsets, error = {}, mapping.error_code(e)
        else:
            error = wire.NONE
        described = []
        for group_id in request.groups:
            described.append(self._describe(group_id, offsets, error))
        return {"throttle_time_ms": 0, "groups": described}

    def _describe(self, group_id: str, offsets: dict[str, list[str]], error: int) -> Any:
        shape = DescribeGroupsResponse.DescribedGroup
        error = group_id_error(group_id) if error == wire.NONE else error
        group = self.membership.table.groups.get(group_id) if error == wire.NONE else None
        if group is None:
            state = str(GroupState.EMPTY) if group_id in offsets else str(GroupState.DEAD)
            return shape(error_code=error, group_id=group_id, group_state=state, protocol_type="",
                         protocol_data="", members=[], authorized_operations=None)
        member_shape = shape.DescribedGroupMember
        members = [member_shape(member_id=m.member_id, group_instance_id=m.instance_id, client_id=m.client_id,
                                client_host=m.client_host,
                                member_metadata=dict(m.protocols).get(group.protocol or "", b""),
                                member_assignment=m.assignment if group.state is GroupState.STABLE else b"")
                   for m in group.members.values()]
        return shape(error_code=wire.NONE, group_id=group_id, group_state=str(group.state),
                     protocol_type=group.protocol_type or "", protocol_data=group.protocol or "", members=members,
                     authorized_operations=None)

    async def delete_groups(self, request: Any, version: int) -> dict[str, Any]:
        """Delete each group's committed offsets (its subscriptions on every topic)."""
        try:
            offsets = await self._offset_topics()
        except RaytxnError as e:
            return {"throttle_time_ms": 0, "results": [
                DeleteGroupsResponse.DeletableGroupResult(group_id=g, error_code=mapping.error_code(e))
                for g in request.groups_names]}
        results = []
        for group_id in request.groups_names:
            results.append(DeleteGroupsResponse.DeletableGroupResult(
                group_id=group_id, error_code=await self._delete(group_id, offsets)))
        return {"throttle_time_ms": 0, "results": results}

    async def _delete(self, group_id: str, offsets: dict[str, list[str]]) -> int:
        error = group_id_error(group_id)
        if error != wire.NONE:
            return error
        group = self.membership.table.groups.get(group_id)
        if group is not None and group.members:
            return NON_EMPTY_GROUP
        topics = offsets.get(group_id)
        if not topics:
            return GROUP_ID_NOT_FOUND
        try:
            for topic in topics:
                await self._delete_subscription(topic, group_id)
        except RaytxnError as e:
            return mapping.error_code(e)
        return wire.NONE
