"""History's Kafka side, assembled: the handlers the history and lake-only filters call.

* :class:`~ksi.history.fetch.FetchHandler`: Fetch, split at the seam (:mod:`ksi.history.seam`), merged;
* :class:`~ksi.history.list_offsets.ListOffsetsHandler`: ListOffsets answered from the lake below the seam;
* :class:`~ksi.history.lake_only.LakeOnlyTopics`: Metadata and Produce for topics that exist only in the
  lake.

The broker's watermarks are asked on each client's own connection (:mod:`ksi.history.watermarks`); the lake
is :class:`~ksi.history.service.History`'s.
"""

from __future__ import annotations

from .fetch import FetchHandler
from .lake_only import LakeOnlyTopics
from .list_offsets import ListOffsetsHandler
from .service import History
from .topic_ids import TopicIds
from .watermarks import Upstream

__all__ = ["HistoryRouter", "Upstream"]


class HistoryRouter:
    def __init__(self, history: History, topic_ids: TopicIds) -> None:
        self.history = history
        self.topic_ids = topic_ids
        self.lake_only = LakeOnlyTopics(history, topic_ids.learn)
        self.fetch = FetchHandler(history, topic_ids, self.lake_only)
        self.list_offsets = ListOffsetsHandler(history, self.lake_only)
