"""Broker address rewriting: every broker endpoint a response names (Metadata, FindCoordinator,
DescribeCluster, the node endpoints of Fetch v16+ and Produce v10+) becomes ksi's listener for that
broker, which is opened first if it is new; topic ids are learnt from Metadata on the way.

A Fetch response's node endpoints are read and replaced in its top-level tagged fields only
(:func:`protocol.fetch_scan.with_node_endpoints`): decoding the whole response would decode its record
batches and encode them again (a broker such as tansu names its node endpoints in every Fetch response)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.api_key import ApiKey

from protocol import Node, needs_rewrite, parse_endpoints
from protocol.fetch_scan import NodeEndpoint, fetch_node_endpoints, scan_fetch_response, with_node_endpoints

from .api import Filter, Response, Session

if TYPE_CHECKING:
    from ..cluster import Cluster
    from ..history.topic_ids import TopicIds

__all__ = ["BrokerAddressFilter"]


class BrokerAddressFilter(Filter):
    name = "broker-addresses"

    def __init__(self, cluster: Cluster, topic_ids: TopicIds) -> None:
        self.cluster = cluster
        self.topic_ids = topic_ids

    def wants_response(self, api_key: int, api_version: int) -> bool:
        return needs_rewrite(api_key, api_version)

    async def on_response(self, response: Response, session: Session) -> None:
        header = response.header
        if header.api_key == ApiKey.Fetch:
            await self._fetch(response)
            return
        endpoints = parse_endpoints(header.api_key, header.api_version, response.body)
        if endpoints is None:
            return
        if header.api_key == ApiKey.Metadata:
            for topic in endpoints.message.topics:
                self.topic_ids.learn(topic.name, getattr(topic, "topic_id", None))
        await self.cluster.learn(endpoints.nodes)
        response.replace_body(endpoints.encode(self.cluster.proxy_address))

    async def _fetch(self, response: Response) -> None:
        body = response.body
        layout = scan_fetch_response(body, response.header.api_version)
        if not layout.node_endpoints:
            return
        endpoints = fetch_node_endpoints(body, layout)
        if not endpoints:
            return
        await self.cluster.learn([Node(e.node_id, e.host, e.port, e.rack) for e in endpoints])
        proxied = []
        for e in endpoints:
            host, port = self.cluster.proxy_address(e.node_id)
            proxied.append(NodeEndpoint(e.node_id, host, port, e.rack, e.tagged))
        response.replace_body(with_node_endpoints(body, layout, proxied))
