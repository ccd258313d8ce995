"""Errors as answers, sans-IO: the response Kafka's broker sends when it cannot handle a request it could
decode (``AbstractRequest.getErrorResponse`` in Kafka: the error code per partition, or per topic, where
the API carries it there).  ksi answers the same way when a request it handles itself fails, instead of
closing the connection, as Kafka's ``KafkaApis.handle`` does for any exception.

A request that does not decode is another matter: Kafka closes the connection then (its ``SocketServer``
cannot build any answer), and so does ksi.
"""

from __future__ import annotations

from kafka.protocol.api_key import ApiKey
from kafka.protocol.api_message import ApiMessage, ApiMessageData
from kafka.protocol.consumer import FetchResponse, ListOffsetsResponse
from kafka.protocol.metadata import ApiVersionsResponse, MetadataResponse
from kafka.protocol.producer import ProduceResponse
from kafka.protocol.sasl import SaslAuthenticateResponse, SaslHandshakeResponse

from . import _tagged_fields  # noqa: F401 - kafka-python's codec keeps unknown tagged fields
from .apis import encode_body

__all__ = ["ANSWERABLE", "error_response", "produce_topic_error"]


def _fetch(request: ApiMessage, version: int, code: int, message: str | None) -> ApiMessage:
    # v13+: the top-level error alone; older versions also carry it in every partition (Kafka's FetchRequest).
    P = FetchResponse.FetchableTopicResponse.PartitionData
    topics = []
    if version < 13:
        for topic in request.topics:
            topics.append(FetchResponse.FetchableTopicResponse(version=version, topic=topic.topic, partitions=[
                P(version=version, partition_index=p.partition, error_code=code, high_watermark=-1,
                  last_stable_offset=-1, log_start_offset=-1, aborted_transactions=None, preferred_read_replica=-1,
                  records=b"") for p in topic.partitions]))
    return FetchResponse(version=version, throttle_time_ms=0, error_code=code,
                         session_id=getattr(request, "session_id", 0) or 0, responses=topics)


def _list_offsets(request: ApiMessage, version: int, code: int, message: str | None) -> ApiMessage:
    T = ListOffsetsResponse.ListOffsetsTopicResponse
    P = T.ListOffsetsPartitionResponse
    topics = []
    for topic in request.topics:
        partitions = []
        for p in topic.partitions:
            answer = P(version=version, partition_index=p.partition_index, error_code=code)
            if version == 0:
                answer.old_style_offsets = []
            else:
                answer.offset, answer.timestamp = -1, -1
            if version >= 4:
                answer.leader_epoch = -1
            partitions.append(answer)
        topics.append(T(version=version, name=topic.name, partitions=partitions))
    return ListOffsetsResponse(version=version, throttle_time_ms=0, topics=topics)


def _metadata(request: ApiMessage, version: int, code: int, message: str | None) -> ApiMessage:
    T = MetadataResponse.MetadataResponseTopic
    topics = []
    for topic in request.topics or []:
        entry = T(version=version, error_code=code, name=topic.name or "", is_internal=False, partitions=[])
        if version >= 10:
            entry.topic_id = topic.topic_id
        topics.append(entry)
    return MetadataResponse(version=version, throttle_time_ms=0, brokers=[], cluster_id=None, controller_id=-1,
                            topics=topics)


def produce_topic_error(topic: ApiMessageData, version: int, code: int, message: str | None) -> ApiMessageData:
    """The ProduceResponse entry refusing every partition of one ``topic_data`` entry of a Produce."""
    R = ProduceResponse.TopicProduceResponse
    P = R.PartitionProduceResponse
    entry = R(version=version, partition_responses=[])
    if version >= 13:
        entry.topic_id = topic.topic_id
    else:
        entry.name = topic.name
    for p in topic.partition_data:
        answer = P(version=version, index=p.index, error_code=code, base_offset=-1, log_append_time_ms=-1,
                   log_start_offset=-1, record_errors=[])
        if version >= 8:
            answer.error_message = message
        entry.partition_responses.append(answer)
    return entry


def _produce(request: ApiMessage, version: int, code: int, message: str | None) -> ApiMessage:
    topics = [produce_topic_error(topic, version, code, message) for topic in request.topic_data]
    return ProduceResponse(version=version, throttle_time_ms=0, responses=topics)


def _sasl_handshake(request: ApiMessage, version: int, code: int, message: str | None) -> ApiMessage:
    return SaslHandshakeResponse(version=version, error_code=code, mechanisms=[])


def _sasl_authenticate(request: ApiMessage, version: int, code: int, message: str | None) -> ApiMessage:
    return SaslAuthenticateResponse(version=version, error_code=code, error_message=message, auth_bytes=b"",
                                    session_lifetime_ms=0)


def _api_versions(request: ApiMessage, version: int, code: int, message: str | None) -> ApiMessage:
    # Kafka's ApiVersionsRequest.getErrorResponse: the code, no APIs.  Written as a v0 body, which every
    # client reads an ApiVersions error as (kafka-python always, Java after the request's version fails).
    return ApiVersionsResponse(version=0, error_code=code, api_keys=[])


_BUILDERS = {ApiKey.Fetch: _fetch, ApiKey.ListOffsets: _list_offsets, ApiKey.Metadata: _metadata,
             ApiKey.Produce: _produce, ApiKey.SaslHandshake: _sasl_handshake,
             ApiKey.SaslAuthenticate: _sasl_authenticate, ApiKey.ApiVersions: _api_versions}
ANSWERABLE = frozenset(int(k) for k in _BUILDERS)


def error_response(api_key: int, version: int, request: ApiMessage, code: int,
                   message: str | None = None) -> bytes | None:
    """The body of Kafka's error response to a decoded ``request`` (every partition or topic it names gets
    ``code``), or None for an API ksi has no error response for (its caller then closes the connection)."""
    build = _BUILDERS.get(api_key)
    if build is None:
        return None
    if api_key == ApiKey.ApiVersions:
        version = 0  # see _api_versions
    return encode_body(build(request, version, code, message), version)
