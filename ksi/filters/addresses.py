"""Broker address rewriting: every broker endpoint a response names (Metadata, FindCoordinator,
DescribeCluster, the node endpoints of Fetch v16+ and Produce v10+) becomes ksi's listener for that
broker, which is opened first if it is new; topic ids are learnt from Metadata on the way."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.api_key import ApiKey

from protocol import needs_rewrite, parse_endpoints

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
        endpoints = parse_endpoints(header.api_key, header.api_version, response.body)
        if endpoints is None:
            return
        if header.api_key == ApiKey.Metadata:
            for topic in endpoints.message.topics:
                self.topic_ids.learn(topic.name, getattr(topic, "topic_id", None))
        await self.cluster.learn(endpoints.nodes)
        response.replace_body(endpoints.encode(self.cluster.proxy_address))
