"""Registry errors that carry the Confluent answer: the HTTP status, the ``error_code`` and the message.

Clients branch on ``error_code`` (confluent-kafka raises ``SchemaRegistryError`` with it; the Java client
maps 40401 to "subject not found" and so on), so the codes and message wording follow Confluent's
``io.confluent.kafka.schemaregistry.rest.exceptions.Errors``.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "INCOMPATIBLE_SCHEMA",
    "INVALID_COMPATIBILITY_LEVEL",
    "INVALID_SCHEMA",
    "INVALID_VERSION",
    "OPERATION_NOT_PERMITTED",
    "REFERENCE_EXISTS",
    "SCHEMA_NOT_FOUND",
    "STORE_ERROR",
    "SUBJECT_LEVEL_COMPATIBILITY_NOT_CONFIGURED",
    "SUBJECT_NOT_FOUND",
    "SUBJECT_NOT_SOFT_DELETED",
    "SUBJECT_SOFT_DELETED",
    "VERSION_NOT_FOUND",
    "VERSION_NOT_SOFT_DELETED",
    "VERSION_SOFT_DELETED",
    "RegistryError",
    "association_not_found",
    "http_error",
    "incompatible_schema",
    "invalid_compatibility_level",
    "invalid_schema",
    "invalid_version",
    "operation_not_permitted",
    "reference_exists",
    "schema_not_found",
    "subject_compatibility_not_configured",
    "subject_not_found",
    "subject_not_soft_deleted",
    "subject_soft_deleted",
    "version_not_found",
    "version_not_soft_deleted",
    "version_soft_deleted",
]

SUBJECT_NOT_FOUND = 40401
VERSION_NOT_FOUND = 40402
SCHEMA_NOT_FOUND = 40403
SUBJECT_SOFT_DELETED = 40404
SUBJECT_NOT_SOFT_DELETED = 40405
VERSION_SOFT_DELETED = 40406
VERSION_NOT_SOFT_DELETED = 40407
SUBJECT_LEVEL_COMPATIBILITY_NOT_CONFIGURED = 40408
ASSOCIATION_NOT_FOUND = 40410
INCOMPATIBLE_SCHEMA = 409
INVALID_SCHEMA = 42201
INVALID_VERSION = 42202
INVALID_COMPATIBILITY_LEVEL = 42203
OPERATION_NOT_PERMITTED = 42205
REFERENCE_EXISTS = 42206
STORE_ERROR = 50001


class RegistryError(Exception):
    """An answer the registry gives instead of a result: ``status`` is the HTTP status, ``error_code`` the
    Confluent code in the JSON body."""

    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.message = message

    def body(self) -> dict[str, object]:
        return {"error_code": self.error_code, "message": self.message}


def subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, SUBJECT_NOT_FOUND, f"Subject '{subject}' not found.")


def version_not_found(version: int | str) -> RegistryError:
    return RegistryError(404, VERSION_NOT_FOUND, f"Version {version} not found.")


def schema_not_found(schema_id: int | None = None) -> RegistryError:
    message = "Schema not found" if schema_id is None else f"Schema {schema_id} not found"
    return RegistryError(404, SCHEMA_NOT_FOUND, message)


def subject_soft_deleted(subject: str) -> RegistryError:
    return RegistryError(404, SUBJECT_SOFT_DELETED,
                         f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently")


def subject_not_soft_deleted(subject: str) -> RegistryError:
    return RegistryError(404, SUBJECT_NOT_SOFT_DELETED,
                         f"Subject '{subject}' was not deleted first before being permanently deleted")


def version_soft_deleted(subject: str, version: int) -> RegistryError:
    return RegistryError(404, VERSION_SOFT_DELETED,
                         f"Subject '{subject}' Version {version} was soft deleted.Set permanent=true to delete "
                         "permanently")


def version_not_soft_deleted(subject: str, version: int) -> RegistryError:
    return RegistryError(404, VERSION_NOT_SOFT_DELETED,
                         f"Subject '{subject}' Version {version} was not deleted first before being permanently "
                         "deleted")


def subject_compatibility_not_configured(subject: str) -> RegistryError:
    return RegistryError(404, SUBJECT_LEVEL_COMPATIBILITY_NOT_CONFIGURED,
                         f"Subject '{subject}' does not have subject-level compatibility configured")


def incompatible_schema(subject: str, messages: Sequence[str]) -> RegistryError:
    return RegistryError(409, INCOMPATIBLE_SCHEMA,
                         f'Schema being registered is incompatible with an earlier schema for subject "{subject}", '
                         f"details: [{', '.join(messages)}]")


def invalid_schema(details: str) -> RegistryError:
    return RegistryError(422, INVALID_SCHEMA, f"Invalid schema: {details}")


def invalid_version(version: str) -> RegistryError:
    return RegistryError(422, INVALID_VERSION,
                         f"The specified version '{version}' is not a valid version id. Allowed values are between "
                         '[1, 2^31-1] and the string "latest"')


def invalid_compatibility_level() -> RegistryError:
    return RegistryError(422, INVALID_COMPATIBILITY_LEVEL,
                         "Invalid compatibility level. Valid values are none, backward, forward, full, "
                         "backward_transitive, forward_transitive, and full_transitive")


def operation_not_permitted(message: str) -> RegistryError:
    return RegistryError(422, OPERATION_NOT_PERMITTED, message)


def reference_exists(subject: str, version: int) -> RegistryError:
    return RegistryError(422, REFERENCE_EXISTS,
                         f"One or more references exist to the schema {{subject={subject},version={version}}}.")


def association_not_found(resource: str) -> RegistryError:
    return RegistryError(404, ASSOCIATION_NOT_FOUND, f"Association for '{resource}' not found.")


def http_error(status: int, reason: str) -> RegistryError:
    """What Confluent's Jersey layer answers for unknown paths, wrong methods and unreadable bodies."""
    return RegistryError(status, status, f"HTTP {status} {reason}")
