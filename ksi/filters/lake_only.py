"""Lake-only topics (configured tables whose topic Kafka does not have): Metadata lists them, and Produce
to them is refused per partition (INVALID_TOPIC_EXCEPTION) while the rest of the request goes to the
broker; see ksi/history/lake_only.py.  A Produce with acks=0 has no answer to carry the refusal: Kafka's
broker closes the connection then (the producer's only signal), and so does ksi, after forwarding the
rest of the request."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kafka.protocol.api_key import ApiKey

from protocol import RequestHeader

from .api import Action, Close, Defer, Filter, Request, Session

if TYPE_CHECKING:
    from ..history.lake_only import LakeOnlyTopics

__all__ = ["LakeOnlyFilter"]

log = logging.getLogger("ksi.connection")


class LakeOnlyFilter(Filter):
    name = "lake-only"

    def __init__(self, topics: LakeOnlyTopics) -> None:
        self.topics = topics
        self._metadata = Defer(topics.metadata)
        self._produce = Defer(topics.produce)

    def wants_request(self, api_key: int, api_version: int) -> bool:
        return api_key in (ApiKey.Metadata, ApiKey.Produce)

    def forwards_unread(self, header: RequestHeader) -> bool:
        return header.api_key == ApiKey.Produce and not self.topics.names

    def on_request(self, request: Request, session: Session) -> Action | None:
        if not self.topics.names:  # none now (the cluster's topics are learnt at each discovery)
            return None
        if request.header.api_key == ApiKey.Metadata:
            return self._metadata
        if not self.topics.named_in(memoryview(request.frame)):
            return None
        if request.expects_response:
            return self._produce
        _, refused, forward = self.topics.split_produce(request.header, memoryview(request.frame))
        if not refused:
            return None
        names = ", ".join(str(getattr(t, "name", None) or t.topic_id) for t in refused)
        if forward is not None:
            request.replace(forward)
        return Close("read_only_topic", f"acks=0 Produce to read-only lake topic(s) {names}: Kafka closes the"
                                        " connection on an acks=0 Produce it refuses",
                     after_forward=forward is not None)
