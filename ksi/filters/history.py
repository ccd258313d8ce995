"""History: Fetch and ListOffsets (v1+) are answered by the history router (ksi/history/routing.py) when
their turn comes, one at a time per connection: the lake below the hot watermark, the broker above it.

A Fetch that names none of the configured topics goes on as its bytes, undecoded (its fetch session
included): the filter looks for each configured topic's name, or from Fetch v13 on its topic id, in the
frame, and hands the request to the router when it finds one, or when a configured topic's id is not
known yet (a false match only costs the router's look).  ListOffsets is always the router's: it is rare.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.api_key import ApiKey

from .api import Action, Defer, Filter, Request, Session

if TYPE_CHECKING:
    from ..history.routing import HistoryRouter

__all__ = ["HistoryFilter"]

FETCH_TOPIC_IDS = 13  # Fetch v13+ names topics by id


class HistoryFilter(Filter):
    name = "history"

    def __init__(self, router: HistoryRouter) -> None:
        self.router = router
        self._fetch = Defer(router.fetch)
        self._list_offsets = Defer(router.list_offsets)
        self._names = tuple(t.name for t in router.history.config.topics)
        self._name_bytes = tuple(name.encode() for name in self._names)

    def wants_request(self, api_key: int, api_version: int) -> bool:
        return api_key == ApiKey.Fetch or (api_key == ApiKey.ListOffsets and api_version >= 1)

    def on_request(self, request: Request, session: Session) -> Action | None:
        if request.header.api_key != ApiKey.Fetch:
            return self._list_offsets
        return self._fetch if self._names_history(request) else None

    def _names_history(self, request: Request) -> bool:
        frame = bytes(request.frame)
        if request.header.api_version < FETCH_TOPIC_IDS:
            return any(name in frame for name in self._name_bytes)
        ids = self.router.topic_ids
        for name in self._names:
            topic_id = ids.id_of(name)
            if topic_id is None or topic_id.bytes in frame:
                return True
        return False
