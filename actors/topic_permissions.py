"""The topic permissions a partition or subscription actor checks produce/consume against.

The supervisor's catalog holds them. An actor fetches its topic's permissions on the first
guarded call that needs them, and the supervisor pushes every change to each actor of the topic
before a grant or revoke returns; each copy carries the catalog's ``permissions_version`` and an
actor keeps the newest it saw, so a slow fetch never undoes a newer push. A restarted actor
starts with nothing cached and fetches again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from raytxn.auth import Access, AuthTarget, guarded
from raytxn.client.rpc import ActorRef
from raytxn.ids import SUPERVISOR_NAME


class TopicPermissions(AuthTarget):
    """Mixed into actor shells (``_actor_ref`` is the shell's)."""

    topic: str
    _permissions: tuple[int, dict[str, list[str]]] | None = None
    _actor_ref: Callable[[str], ActorRef]

    def _auth_scope(self) -> str:
        return f"topic {self.topic!r}"

    async def _topic_permissions(self) -> Mapping[str, Iterable[str]]:
        if self._permissions is None:
            supervisor = self._actor_ref(SUPERVISOR_NAME)
            found = await supervisor.call_async("topic_permissions", self.topic, deadline_s=30.0)
            self._keep_permissions(found["version"], found["permissions"])
        assert self._permissions is not None
        return self._permissions[1]

    def _keep_permissions(self, version: int, permissions: dict[str, list[str]]) -> None:
        if self._permissions is None or version >= self._permissions[0]:
            self._permissions = (version, permissions)

    @guarded(Access.SUPERUSER)
    async def set_topic_permissions(self, version: int, permissions: dict[str, list[str]]) -> None:
        """The supervisor's push after a grant or revoke."""
        self._keep_permissions(version, permissions)
