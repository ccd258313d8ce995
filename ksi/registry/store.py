"""The registry's state and its rules: subjects, versions, global schema ids and compatibility config,
persisted in SQLite so a restart keeps them.

    DATA_DIR/registry.db
      schemas   (id, schema_type, text, refs, fingerprint)  one row per distinct schema; ids are global:
                the same schema (same ``ParsedSchema.key``) under any subject gets the same id, as in
                Confluent's registry
      versions  (subject, version, schema_id, deleted)       a subject's history; deletes are soft first
      config    (subject, compatibility)                     '' is the global level

Every operation takes one lock: a registry sees few writes, and serialising them makes "look for the
schema, check compatibility, assign id and version" atomic without retry loops. Parsed schemas are
cached by id (a schema never changes once it has an id).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import errors
from .compat import DEFAULT_LEVEL, LEVELS, check_level
from .schema import SCHEMA_TYPES, ParsedSchema, SchemaReference, parse

__all__ = ["LATEST", "SchemaStore", "SubjectVersion", "parse_version"]

LATEST = -1
_MAX_VERSION = 2**31 - 1
_GLOBAL = ""  # the config row of the global compatibility level

_TABLES = """
CREATE TABLE IF NOT EXISTS schemas (
    id          INTEGER PRIMARY KEY,
    schema_type TEXT NOT NULL,
    text        TEXT NOT NULL,
    refs        TEXT NOT NULL,
    fingerprint TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS versions (
    subject   TEXT NOT NULL,
    version   INTEGER NOT NULL,
    schema_id INTEGER NOT NULL REFERENCES schemas (id),
    deleted   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (subject, version)
);
CREATE INDEX IF NOT EXISTS versions_by_schema ON versions (schema_id);
CREATE TABLE IF NOT EXISTS config (
    subject       TEXT PRIMARY KEY,
    compatibility TEXT NOT NULL
);
PRAGMA user_version = 1;
"""


def parse_version(text: str) -> int:
    """A version path segment: ``latest`` or ``-1`` is ``LATEST``, else 1..2^31-1; 42202 otherwise."""
    if text == "latest":
        return LATEST
    try:
        version = int(text)
    except ValueError:
        raise errors.invalid_version(text) from None
    if version == LATEST or 1 <= version <= _MAX_VERSION:
        return version
    raise errors.invalid_version(text)


@dataclass(frozen=True, slots=True)
class SubjectVersion:
    subject: str
    version: int
    schema_id: int
    schema: ParsedSchema
    deleted: bool = False


class SchemaStore:
    def __init__(self, data_dir: str | Path) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.data_dir / "registry.db"
        self._lock = threading.RLock()
        self._parsed: dict[int, ParsedSchema] = {}
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.executescript(_TABLES)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- schemas by id ------------------------------------------------------------------------------------

    def schema_by_id(self, schema_id: int) -> ParsedSchema:
        """The schema with this id while some subject version (soft-deleted ones too) holds it; 40403."""
        with self._lock:
            if self._db.execute("SELECT 1 FROM versions WHERE schema_id = ? LIMIT 1", (schema_id,)).fetchone():
                return self._schema(schema_id)
            raise errors.schema_not_found(schema_id)

    def subject_versions_of(self, schema_id: int, deleted: bool = False) -> list[tuple[str, int]]:
        """``(subject, version)`` pairs that hold this id, sorted; 40403 for an unknown id."""
        with self._lock:
            rows = self._db.execute(
                "SELECT subject, version, deleted FROM versions WHERE schema_id = ? ORDER BY subject, version",
                (schema_id,)).fetchall()
        if not rows:
            raise errors.schema_not_found(schema_id)
        return [(subject, version) for subject, version, gone in rows if deleted or not gone]

    def all_schemas(self, subject_prefix: str = "", deleted: bool = False,
                    latest_only: bool = False) -> list[SubjectVersion]:
        with self._lock:
            rows = self._db.execute(
                "SELECT subject, version, schema_id, deleted FROM versions WHERE substr(subject, 1, ?) = ? "
                "ORDER BY subject, version", (len(subject_prefix), subject_prefix)).fetchall()
            found = [SubjectVersion(s, v, i, self._schema(i), bool(d)) for s, v, i, d in rows if deleted or not d]
        if latest_only:
            latest = {sv.subject: sv for sv in found}
            found = list(latest.values())
        return found

    # -- subjects and versions ------------------------------------------------------------------------------

    def subjects(self, subject_prefix: str = "", deleted: bool = False, deleted_only: bool = False) -> list[str]:
        with self._lock:
            rows = self._db.execute(
                "SELECT subject, MIN(deleted) FROM versions WHERE substr(subject, 1, ?) = ? "
                "GROUP BY subject ORDER BY subject", (len(subject_prefix), subject_prefix)).fetchall()
        # MIN(deleted) = 0: some version is live; 1: the subject was soft-deleted.
        if deleted_only:
            return [subject for subject, gone in rows if gone]
        return [subject for subject, gone in rows if deleted or not gone]

    def versions(self, subject: str, deleted: bool = False, deleted_only: bool = False) -> list[int]:
        with self._lock:
            rows = self._rows(subject, deleted=True)
        if deleted_only:
            found = [version for version, _, gone in rows if gone]
        else:
            found = [version for version, _, gone in rows if deleted or not gone]
        if not found and not (deleted_only and rows):
            raise errors.subject_not_found(subject)
        return found

    def version(self, subject: str, version: int, deleted: bool = False) -> SubjectVersion:
        with self._lock:
            rows = self._rows(subject, deleted)
            if not rows:
                raise errors.subject_not_found(subject)
            row = rows[-1] if version == LATEST else next((r for r in rows if r[0] == version), None)
            if row is None:
                raise errors.version_not_found(version)
            return SubjectVersion(subject, row[0], row[1], self._schema(row[1]), bool(row[2]))

    def referenced_by(self, subject: str, version: int) -> list[int]:
        """Ids of live schemas that reference this subject version."""
        held = self.version(subject, version, deleted=True)
        with self._lock:
            return self._referencing(subject, held.version)

    # -- register and look up ---------------------------------------------------------------------------------

    def register(self, subject: str, schema_type: str, text: str,
                 references: Sequence[SchemaReference] = ()) -> int:
        """Register under ``subject`` and return the global id: an existing version's id when the subject
        already holds this schema, else a new version after the compatibility check (409 when it fails)."""
        with self._lock:
            new = self._parse(schema_type, text, references)
            live = self._rows(subject)
            for _, schema_id, _ in live:
                if self._schema(schema_id).key == new.key:
                    return schema_id
            level = self._level(subject)
            problems = check_level(new, [(v, self._schema(i)) for v, i, _ in live], level)
            if problems:
                raise errors.incompatible_schema(subject, problems)
            with self._transaction():
                schema_id = self._id_for(new)
                (version,) = self._db.execute(
                    "SELECT COALESCE(MAX(version), 0) + 1 FROM versions WHERE subject = ?", (subject,)).fetchone()
                self._db.execute("INSERT INTO versions (subject, version, schema_id) VALUES (?, ?, ?)",
                                 (subject, version, schema_id))
            return schema_id

    def lookup(self, subject: str, schema_type: str, text: str, references: Sequence[SchemaReference] = (),
               deleted: bool = False) -> SubjectVersion:
        """The version of ``subject`` holding this schema: 40401 no such subject, 40403 not under it."""
        with self._lock:
            rows = self._rows(subject, deleted)
            if not rows:
                raise errors.subject_not_found(subject)
            wanted = self._parse(schema_type, text, references)
            for version, schema_id, gone in reversed(rows):
                schema = self._schema(schema_id)
                if schema.key == wanted.key:
                    return SubjectVersion(subject, version, schema_id, schema, bool(gone))
            raise errors.schema_not_found()

    def test_compatibility(self, subject: str, version: int | None, schema_type: str, text: str,
                           references: Sequence[SchemaReference] = ()) -> list[str]:
        """Why the schema could not be registered next to ``version`` (``LATEST``: the versions the
        subject's level checks; ``None``: likewise); an empty list when it could."""
        with self._lock:
            new = self._parse(schema_type, text, references)
            live = self._rows(subject)
            level = self._level(subject)
            if version is None or version == LATEST:
                return check_level(new, [(v, self._schema(i)) for v, i, _ in live], level)
            if not self._rows(subject, deleted=True):
                raise errors.subject_not_found(subject)
            row = next((r for r in live if r[0] == version), None)
            if row is None:
                raise errors.version_not_found(version)
            return check_level(new, [(row[0], self._schema(row[1]))], level.removesuffix("_TRANSITIVE"))

    # -- deletes ------------------------------------------------------------------------------------------------

    def delete_subject(self, subject: str, permanent: bool = False) -> list[int]:
        """Soft-delete every live version, or with ``permanent`` drop a soft-deleted subject for good."""
        with self._lock:
            rows = self._rows(subject, deleted=True)
            if not rows:
                raise errors.subject_not_found(subject)
            live = [version for version, _, gone in rows if not gone]
            if permanent and live:
                raise errors.subject_not_soft_deleted(subject)
            if not permanent and not live:
                raise errors.subject_soft_deleted(subject)
            targets = [version for version, _, _ in rows] if permanent else live
            for version in targets:
                if self._referencing(subject, version):
                    raise errors.reference_exists(subject, version)
            with self._transaction():
                if permanent:
                    self._db.execute("DELETE FROM versions WHERE subject = ?", (subject,))
                    self._db.execute("DELETE FROM config WHERE subject = ?", (subject,))
                else:
                    self._db.execute("UPDATE versions SET deleted = 1 WHERE subject = ?", (subject,))
            return targets

    def delete_version(self, subject: str, version: int, permanent: bool = False) -> int:
        with self._lock:
            rows = self._rows(subject, deleted=True)
            if not rows:
                raise errors.subject_not_found(subject)
            if version == LATEST:
                candidates = rows if permanent else [r for r in rows if not r[2]]
                row = candidates[-1] if candidates else None
            else:
                row = next((r for r in rows if r[0] == version), None)
            if row is None:
                raise errors.version_not_found(version)
            found, _, gone = row
            if permanent and not gone:
                raise errors.version_not_soft_deleted(subject, found)
            if not permanent and gone:
                raise errors.version_soft_deleted(subject, found)
            if self._referencing(subject, found):
                raise errors.reference_exists(subject, found)
            with self._transaction():
                if permanent:
                    self._db.execute("DELETE FROM versions WHERE subject = ? AND version = ?", (subject, found))
                else:
                    self._db.execute("UPDATE versions SET deleted = 1 WHERE subject = ? AND version = ?",
                                     (subject, found))
            return found

    # -- compatibility config -----------------------------------------------------------------------------------

    def compatibility(self, subject: str | None = None) -> str | None:
        """The level set for ``subject`` (None: not set), or the global level when ``subject`` is None."""
        with self._lock:
            row = self._db.execute("SELECT compatibility FROM config WHERE subject = ?",
                                   (_GLOBAL if subject is None else subject,)).fetchone()
        if row is None:
            return DEFAULT_LEVEL if subject is None else None
        return str(row[0])

    def set_compatibility(self, subject: str | None, level: str) -> str:
        level = level.upper()
        if level not in LEVELS:
            raise errors.invalid_compatibility_level()
        if subject == _GLOBAL:
            raise errors.operation_not_permitted("The subject name may not be empty")
        with self._lock, self._transaction():
            self._db.execute("INSERT OR REPLACE INTO config (subject, compatibility) VALUES (?, ?)",
                             (_GLOBAL if subject is None else subject, level))
        return level

    def delete_compatibility(self, subject: str | None) -> str:
        """Drop the level set for ``subject`` (the global one: back to the default); return the old one."""
        with self._lock:
            old = self.compatibility(subject)
            if old is None:
                raise errors.subject_compatibility_not_configured(str(subject))
            with self._transaction():
                self._db.execute("DELETE FROM config WHERE subject = ?", (_GLOBAL if subject is None else subject,))
            return old

    # -- internals (call with the lock held) ----------------------------------------------------------------------

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _rows(self, subject: str, deleted: bool = False) -> list[tuple[int, int, int]]:
        """``(version, schema_id, deleted)`` of a subject, oldest first; live ones only unless ``deleted``."""
        rows = self._db.execute("SELECT version, schema_id, deleted FROM versions WHERE subject = ? ORDER BY version",
                                (subject,)).fetchall()
        return [(int(v), int(i), int(d)) for v, i, d in rows if deleted or not d]

    def _level(self, subject: str) -> str:
        return self.compatibility(subject) or self.compatibility(None) or DEFAULT_LEVEL

    def _parse(self, schema_type: str, text: str, references: Sequence[SchemaReference],
               stored: bool = False) -> ParsedSchema:
        """Parse a schema, resolving its references (``latest`` becomes a version number). A submitted
        schema may only reference live versions; a ``stored`` one keeps reading soft-deleted ones."""
        resolved: list[SchemaReference] = []
        names: dict[str, Any] = {}
        for ref in references:
            try:
                held = self.version(ref.subject, ref.version, deleted=stored)
            except errors.RegistryError as exc:
                raise errors.invalid_schema(f"reference '{ref.name}' to {ref.subject} version {ref.version}: "
                                            f"{exc.message}") from None
            resolved.append(SchemaReference(ref.name, ref.subject, held.version))
            names.update(held.schema.names)
        return parse(schema_type, text, resolved, names)

    def _schema(self, schema_id: int) -> ParsedSchema:
        schema = self._parsed.get(schema_id)
        if schema is None:
            row = self._db.execute("SELECT schema_type, text, refs FROM schemas WHERE id = ?", (schema_id,)).fetchone()
            if row is None:
                raise errors.schema_not_found(schema_id)
            schema_type, text, refs = row
            assert schema_type in SCHEMA_TYPES, schema_type
            references = [SchemaReference(r["name"], r["subject"], r["version"]) for r in json.loads(refs)]
            schema = self._parsed[schema_id] = self._parse(schema_type, text, references, stored=True)
        return schema

    def _id_for(self, schema: ParsedSchema) -> int:
        """The global id of this schema, a new one if no subject ever held it (inside a transaction)."""
        fingerprint = hashlib.sha256(schema.key.encode()).hexdigest()
        row = self._db.execute("SELECT id FROM schemas WHERE fingerprint = ?", (fingerprint,)).fetchone()
        if row is not None:
            return int(row[0])
        (schema_id,) = self._db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM schemas").fetchone()
        refs = json.dumps([r.to_json() for r in schema.references])
        self._db.execute("INSERT INTO schemas (id, schema_type, text, refs, fingerprint) VALUES (?, ?, ?, ?, ?)",
                         (schema_id, schema.schema_type, schema.text, refs, fingerprint))
        return int(schema_id)

    def _referencing(self, subject: str, version: int) -> list[int]:
        rows = self._db.execute(
            "SELECT id, refs FROM schemas WHERE refs != '[]' AND id IN (SELECT schema_id FROM versions "
            "WHERE deleted = 0)").fetchall()
        return [int(schema_id) for schema_id, refs in rows
                if any(r["subject"] == subject and r["version"] == version for r in json.loads(refs))]
