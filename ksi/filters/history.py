"""History: Fetch and ListOffsets (v1+) are answered by the history router (ksi/history/routing.py) when
their turn comes, one at a time per connection: the lake below the hot watermark, the broker above it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.api_key import ApiKey

from .api import Action, Defer, Filter, Request, Session

if TYPE_CHECKING:
    from ..history.routing import HistoryRouter

__all__ = ["HistoryFilter"]


class HistoryFilter(Filter):
    name = "history"

    def __init__(self, router: HistoryRouter) -> None:
        self.router = router
        self._fetch = Defer(router.fetch)
        self._list_offsets = Defer(router.list_offsets)

    def wants_request(self, api_key: int, api_version: int) -> bool:
        return api_key == ApiKey.Fetch or (api_key == ApiKey.ListOffsets and api_version >= 1)

    def on_request(self, request: Request, session: Session) -> Action | None:
        return self._fetch if request.header.api_key == ApiKey.Fetch else self._list_offsets
