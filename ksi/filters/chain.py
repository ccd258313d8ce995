"""The filter chain: the filters the config asks for, in order, and which of them each (API key, version)
reaches.

Requests pass the filters front to back; responses pass them back to front (broker side first), and a
filter's answer passes back only through the filters in front of it, as in Kroxylicious.  Which filters a
pair reaches is worked out the first time the pair is seen and kept: the chain costs a request that no
filter wants one dictionary lookup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .addresses import BrokerAddressFilter
from .api import Filter
from .api_versions import ApiVersionsFilter
from .metrics import MetricsFilter
from .sasl import SaslFilter

if TYPE_CHECKING:
    from ..cluster import Cluster
    from ..history.routing import HistoryRouter
    from ..history.topic_ids import TopicIds

__all__ = ["FilterChain", "Route", "build_chain"]


@dataclass(frozen=True, slots=True)
class Route:
    """The filters one (API key, version) reaches: ``(position in the chain, filter)`` pairs."""

    request: tuple[tuple[int, Filter], ...]
    response: tuple[tuple[int, Filter], ...]  # back to front
    response_defers: bool = False              # a response filter may hand the request to ksi (keep it)
    # No filter looks at the request or its response: forward bytes, relay bytes (a field, not a property:
    # the connection asks it for every request).
    untouched: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "untouched", not self.request and not self.response)

    def response_before(self, position: int) -> tuple[tuple[int, Filter], ...]:
        """The response filters an answer given by the filter at ``position`` passes through."""
        return tuple(item for item in self.response if item[0] < position)


class FilterChain:
    def __init__(self, filters: list[Filter]) -> None:
        self.filters = tuple(filters)
        self.observers = tuple(f for f in filters if f.observes)
        self._routes: dict[tuple[int, int], Route] = {}

    def route(self, api_key: int, api_version: int) -> Route:
        key = (api_key, api_version)
        found = self._routes.get(key)
        if found is None:
            indexed = list(enumerate(self.filters))
            response = tuple((i, f) for i, f in reversed(indexed) if f.wants_response(api_key, api_version))
            found = Route(
                request=tuple((i, f) for i, f in indexed if f.wants_request(api_key, api_version)),
                response=response,
                response_defers=any(f.defers_responses for _, f in response),
            )
            self._routes[key] = found
        return found

    def __str__(self) -> str:
        return " -> ".join(f.name for f in self.filters)


def build_chain(cluster: Cluster, topic_ids: TopicIds, router: HistoryRouter | None = None) -> FilterChain:
    """ksi's chain, from the config: metrics, ApiVersions, broker addresses and SASL always; lake-only
    topics and history when ``[[topics]]`` are configured (``router``).  A new concern is a new filter here."""
    filters: list[Filter] = [MetricsFilter(), ApiVersionsFilter(), BrokerAddressFilter(cluster, topic_ids),
                             SaslFilter()]
    if router is not None:
        from .history import HistoryFilter
        from .lake_only import LakeOnlyFilter

        filters += [LakeOnlyFilter(router.lake_only), HistoryFilter(router)]
    return FilterChain(filters)
