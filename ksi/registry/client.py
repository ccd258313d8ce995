"""A small blocking client for the Confluent Schema Registry REST API, as the proxy and pipeline use it.

ksi only needs a handful of calls (schema by id, a subject's versions, register, look up), so this is
``urllib`` with caches instead of a dependency: schemas by id never change, so they are cached for
good; subject listings are cached briefly.  Every failure is a :class:`RegistryUnavailable` (could
not talk to it) or :class:`RegistryRejected` (it answered with an error), naming the URL.
Callers run it in worker threads (it blocks).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

__all__ = ["RegisteredSchema", "RegistryClient", "RegistryClientError", "RegistryRejected", "RegistryUnavailable"]

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
SUBJECT_TTL_SECONDS = 5.0


class RegistryClientError(Exception):
    """The Schema Registry could not answer."""


class RegistryUnavailable(RegistryClientError):
    """No answer: connection refused, timeout, DNS (``reason``)."""

    def __init__(self, message: str, reason: object) -> None:
        super().__init__(message)
        self.reason = reason


class RegistryRejected(RegistryClientError):
    """The registry answered with an error status."""

    def __init__(self, message: str, status: int, error_code: int | None) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    schema_id: int
    schema: str
    schema_type: str = "AVRO"
    subject: str | None = None
    version: int | None = None


class RegistryClient:
    def __init__(self, url: str, timeout_seconds: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self._by_id: dict[int, RegisteredSchema] = {}
        self._subjects: dict[str, tuple[float, list[RegisteredSchema]]] = {}
        self._lock = threading.Lock()

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": CONTENT_TYPE, "Accept": CONTENT_TYPE})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_seconds) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read() or b"{}")
            except ValueError:
                detail = {}
            message = detail.get("message") or exc.reason
            raise RegistryRejected(f"schema registry {self.url}: {method} {path}: {exc.code} {message}", exc.code,
                                   detail.get("error_code")) from None
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RegistryUnavailable(f"schema registry {self.url} is unreachable: {reason}", reason) from None

    def problem(self) -> object | None:
        """Why the registry does not answer (connection refused, timeout, DNS), or None if it answers at all."""
        try:
            self._call("GET", "/subjects")
        except RegistryUnavailable as exc:
            return exc.reason
        except RegistryRejected:
            pass  # it answered
        return None

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        found = self._by_id.get(schema_id)
        if found is None:
            answer = self._call("GET", f"/schemas/ids/{schema_id}")
            found = RegisteredSchema(schema_id, answer["schema"], answer.get("schemaType", "AVRO"))
            with self._lock:
                self._by_id[schema_id] = found
        return found

    def versions(self, subject: str, fresh: bool = False) -> list[RegisteredSchema]:
        """Every version registered under ``subject``, oldest first (empty if the subject is unknown)."""
        cached = self._subjects.get(subject)
        if cached is not None and not fresh and time.monotonic() - cached[0] < SUBJECT_TTL_SECONDS:
            return cached[1]
        try:
            numbers = self._call("GET", f"/subjects/{quote(subject, safe='')}/versions")
        except RegistryRejected as exc:
            if exc.status != 404:
                raise
            numbers = []
        found = []
        for number in numbers:
            answer = self._call("GET", f"/subjects/{quote(subject, safe='')}/versions/{number}")
            found.append(RegisteredSchema(answer["id"], answer["schema"], answer.get("schemaType", "AVRO"),
                                          subject, answer["version"]))
        with self._lock:
            self._subjects[subject] = (time.monotonic(), found)
            for schema in found:
                self._by_id.setdefault(schema.schema_id, schema)
        return found

    def register(self, subject: str, schema: str, schema_type: str = "AVRO") -> int:
        body: dict[str, Any] = {"schema": schema}
        if schema_type != "AVRO":
            body["schemaType"] = schema_type
        answer = self._call("POST", f"/subjects/{quote(subject, safe='')}/versions", body)
        with self._lock:
            self._subjects.pop(subject, None)
        return int(answer["id"])
