"""The jars the pipeline's Spark needs, found (and the one that must be built, built) on this machine.

* The Iceberg Spark runtime, ``iceberg-spark-runtime-3.5_2.12-*.jar``, from the
  ``snowpark-connect-deps-iceberg`` wheel.  That build lacks its shaded Jackson classes, so it comes
  with a companion jar: pyspark's own ``jackson-{core,databind,annotations}`` relocated to
  ``org.apache.iceberg.shaded.com.fasterxml.jackson`` with Debian's ``jarjar``, built once into
  :func:`jar_cache_dir`.  A user who supplies the official runtime jar (``[spark] iceberg_runtime_jar``)
  needs neither.
* The JDBC drivers of the Iceberg JDBC catalog: Debian's ``sqlite-jdbc`` (whose native part lives in a
  JNI directory) and ``postgresql`` jars.

``python -m ksi.pipeline.jars`` builds the Jackson jar if it is missing, starts and stops the pipeline's
Spark once (which makes the JVMs' class-data archives, :mod:`ksi.pipeline.jvm`) and prints what was found;
``scripts/install-spark-deps.sh`` runs it after installing the Debian packages.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib.util import find_spec
from pathlib import Path

__all__ = [
    "MissingDependency",
    "bundled_iceberg_runtime_jar",
    "jackson_fix_jar",
    "jar_cache_dir",
    "jdbc_driver_jars",
    "jni_library_dirs",
    "pyspark_jars_dir",
]

JACKSON_JARS = ("jackson-core", "jackson-databind", "jackson-annotations")
JACKSON_RULE = "rule com.fasterxml.jackson.** org.apache.iceberg.shaded.com.fasterxml.jackson.@1\n"
JARJAR_CANDIDATES = ("/usr/share/java/jarjar.jar", "/usr/share/java/jarjar-1.4.jar")
SQLITE_JDBC = ("/usr/share/java/sqlite-jdbc.jar", "/usr/share/java/xerial-sqlite-jdbc.jar")
POSTGRES_JDBC = ("/usr/share/java/postgresql.jar",)
JNI_DIRS = ("/usr/lib/x86_64-linux-gnu/jni", "/usr/lib/aarch64-linux-gnu/jni", "/usr/lib/jni")
INSTALL_HINT = "run scripts/install-spark-deps.sh (or `make test`, which runs it)"


class MissingDependency(RuntimeError):
    """Something the pipeline needs is not installed; the message says how to install it."""


def jar_cache_dir() -> Path:
    """Where built jars are kept: ``KSI_JAR_CACHE`` or ``<venv>/share/ksi/jars`` (per Python environment,
    so it matches that environment's pyspark)."""
    override = os.environ.get("KSI_JAR_CACHE")
    return Path(override) if override else Path(sys.prefix) / "share" / "ksi" / "jars"


def pyspark_jars_dir() -> Path:
    spec = find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependency("pyspark is not installed: pip install 'pyspark>=3.5,<3.6'"
                                " (or pip install -e '.[spark]')")
    return Path(next(iter(spec.submodule_search_locations))) / "jars"


def bundled_iceberg_runtime_jar() -> Path:
    """``iceberg-spark-runtime-3.5_2.12-*.jar`` from the ``snowpark-connect-deps-iceberg`` wheel."""
    spec = find_spec("snowpark_connect_deps_iceberg")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependency(
            "the Iceberg Spark runtime jar is missing: pip install snowpark-connect-deps-iceberg==1.0.3, or set "
            "[spark] iceberg_runtime_jar (--iceberg-jar) to the official iceberg-spark-runtime-3.5_2.12 jar")
    for location in spec.submodule_search_locations:
        found = sorted(glob.glob(os.path.join(location, "jars", "iceberg-spark-runtime-3.5_2.12-*.jar")))
        if found:
            return Path(found[-1])
    raise MissingDependency("snowpark-connect-deps-iceberg has no iceberg-spark-runtime-3.5_2.12 jar"
                            " (broken install?): pip install --force-reinstall snowpark-connect-deps-iceberg==1.0.3")


def _pyspark_jackson_jars() -> list[Path]:
    jars_dir = pyspark_jars_dir()
    found = []
    for name in JACKSON_JARS:
        matches = sorted(jars_dir.glob(f"{name}-2.*.jar"))
        if not matches:
            raise MissingDependency(f"pyspark ships no {name} jar in {jars_dir} (broken pyspark install?)")
        found.append(matches[-1])
    return found


def jackson_fix_jar(build: bool = True) -> Path:
    """The relocated Jackson jar the bundled Iceberg runtime needs; built with jarjar when missing."""
    sources = _pyspark_jackson_jars()
    version = sources[0].stem.rsplit("-", 1)[-1]
    target = jar_cache_dir() / f"iceberg-shaded-jackson-{version}.jar"
    if target.is_file():
        return target
    if not build:
        raise MissingDependency(f"the relocated Jackson jar {target} is not built: {INSTALL_HINT}")
    jarjar = next((p for p in JARJAR_CANDIDATES if os.path.isfile(p)), None)
    if jarjar is None:
        raise MissingDependency(f"the relocated Jackson jar {target} is not built and Debian's jarjar is missing to "
                                f"build it: apt-get install libjarjar-java, or {INSTALL_HINT}")
    java = shutil.which("java") or (os.path.join(os.environ["JAVA_HOME"], "bin", "java")
                                    if os.environ.get("JAVA_HOME") else None)
    if java is None:
        raise MissingDependency("Java is needed to build the relocated Jackson jar:"
                                " apt-get install openjdk-17-jre-headless")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        merged, rules, out = Path(tmp, "merged.jar"), Path(tmp, "rules.txt"), Path(tmp, "out.jar")
        seen: set[str] = set()
        with zipfile.ZipFile(merged, "w", zipfile.ZIP_DEFLATED) as zout:
            for source in sources:
                with zipfile.ZipFile(source) as zin:
                    for info in zin.infolist():
                        # classes only: manifests, module-info and service files name the unrelocated packages
                        if info.is_dir() or info.filename in seen or info.filename.startswith("META-INF/"):
                            continue
                        seen.add(info.filename)
                        zout.writestr(info, zin.read(info))
        rules.write_text(JACKSON_RULE)
        result = subprocess.run([java, "-jar", jarjar, "process", str(rules), str(merged), str(out)],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0 or not out.is_file():
            raise MissingDependency(f"jarjar failed to relocate Jackson ({result.returncode}): {result.stderr.strip()}")
        os.replace(out, target)  # atomic: a concurrent builder never sees half a jar
    return target


def jdbc_driver_jars() -> list[Path]:
    """Debian's SQLite and PostgreSQL JDBC drivers, those that are installed."""
    jars = []
    for candidates in (SQLITE_JDBC, POSTGRES_JDBC):
        found = next((p for p in candidates if os.path.isfile(p)), None)
        if found:
            jars.append(Path(found))
    return jars


def jni_library_dirs() -> list[str]:
    """Directories holding Debian's JNI libraries (sqlite-jdbc's native part), for ``java.library.path``."""
    return [d for d in JNI_DIRS if os.path.isdir(d)]


def main() -> int:
    try:
        runtime = bundled_iceberg_runtime_jar()
        jackson = jackson_fix_jar(build=True)
    except MissingDependency as exc:
        print(f"ksi.pipeline.jars: {exc}", file=sys.stderr)
        return 1
    drivers = jdbc_driver_jars()
    print(f"iceberg runtime: {runtime}\nrelocated jackson: {jackson}\n"
          f"jdbc drivers: {', '.join(map(str, drivers)) or 'none'}\n"
          f"jni dirs: {', '.join(jni_library_dirs()) or 'none'}", flush=True)
    # the JVMs' class-data archives and the driver's command line, made now rather than by a first run
    from .spark import SparkSetupError, prepare_jvm

    try:
        for line in prepare_jvm():
            print(line)
    except SparkSetupError as exc:
        print(f"ksi.pipeline.jars: Spark not prepared: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
