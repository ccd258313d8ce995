"""Topic ids, learned from Metadata responses (Fetch v13+ names topics by id)."""

from __future__ import annotations

import uuid

__all__ = ["TopicIds"]


class TopicIds:
    """Topic name <-> id, learned from Metadata responses (Fetch v13+ names topics by id)."""

    def __init__(self) -> None:
        self._names: dict[uuid.UUID, str] = {}
        self._ids: dict[str, uuid.UUID] = {}

    def learn(self, name: str | None, topic_id: uuid.UUID | None) -> None:
        if name and topic_id is not None and topic_id != uuid.UUID(int=0):
            self._names[topic_id] = name
            self._ids[name] = topic_id

    def name(self, topic_id: uuid.UUID) -> str | None:
        return self._names.get(topic_id)

    def id_of(self, name: str) -> uuid.UUID | None:
        """The topic id last learnt for ``name`` (a topic deleted and re-created gets a new one)."""
        return self._ids.get(name)
