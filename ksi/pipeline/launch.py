"""The archive's driver JVM launched without spark-submit's scripts once its command line is known.

pyspark starts the driver JVM with ``$SPARK_HOME/bin/spark-submit``: bash scripts that find Spark's home
and load its environment, then a JVM of its own (Spark's launcher, ``org.apache.spark.launcher.Main``) that
only prints the driver JVM's command line, which the script then execs.  Measured on the project's 2-core
VM: 0.25-0.35 s before the driver JVM itself starts, on every run.

The driver's command line is Java, options and class path (from Java's home, Spark's home, the driver's
memory, class path and Java options, and the environment), then ``SparkSubmit`` and the submit arguments
passed through unchanged.  So the first launch runs the launcher as spark-class does and keeps the part
before the submit arguments in the jar cache, under a hash of everything the launcher reads
(:func:`_key`); later launches run Java directly with it.  The gateway is then made as pyspark's
``launch_gateway`` makes it.  Anything unusual (a ``spark-env.sh``, Windows) takes pyspark's own way.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .jars import jar_cache_dir

__all__ = ["launch_gateway"]

SUBMIT = "org.apache.spark.deploy.SparkSubmit"
# Settings the launcher turns into the driver JVM's command line (everything else it passes through)
LAUNCHER_KEYS = ("spark.master", "spark.submit.deployMode", "spark.driver.memory", "spark.driver.extraJavaOptions",
                 "spark.driver.defaultJavaOptions", "spark.driver.extraClassPath", "spark.driver.extraLibraryPath")
ENV_PREFIXES = ("SPARK_", "HADOOP_", "YARN_", "JAVA_", "_JAVA_", "JDK_")


def _submit_args(conf: dict[str, str]) -> list[str]:
    args = []
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return [*args, "pyspark-shell"]


def _key(spark_home: str, java_home: str, conf: dict[str, str]) -> str:
    from .jvm import java_release

    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
    defaults = Path(os.environ.get("SPARK_CONF_DIR", os.path.join(spark_home, "conf")), "spark-defaults.conf")
    parts = {"spark_home": spark_home, "java": java_release(java_home), "conf": {k: conf.get(k) for k in LAUNCHER_KEYS},
             "env": env, "python": sys.executable,
             "defaults": defaults.read_text(errors="replace") if defaults.is_file() else None}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def _driver_command(spark_home: str, java_home: str, conf: dict[str, str], args: list[str]) -> list[str] | None:
    """The driver JVM's command line before the submit arguments: from the cache, else from Spark's launcher
    (then cached); None when it cannot be had this way."""
    cache = jar_cache_dir() / "launch" / f"{_key(spark_home, java_home, conf)}.json"
    try:
        return list(json.loads(cache.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        pass
    env = dict(os.environ, SPARK_HOME=spark_home, JAVA_HOME=java_home)
    env.setdefault("SPARK_SCALA_VERSION", "2.12")      # as load-spark-env.sh sets it for a pip-installed Spark
    env.setdefault("SPARK_CONF_DIR", os.path.join(spark_home, "conf"))
    env["SPARK_ENV_LOADED"] = "1"
    launcher = [os.path.join(java_home, "bin", "java"), "-Xmx128m", *env.get("SPARK_LAUNCHER_OPTS", "").split(),
                "-cp", os.path.join(spark_home, "jars", "*"), "org.apache.spark.launcher.Main", SUBMIT, *args]
    try:
        out = subprocess.run(launcher, env=env, capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    # messages, a NUL and a newline, then the command, each argument followed by a NUL (as spark-class reads it)
    _, marker, rest = out.decode().partition("\0\n")
    command = rest.split("\0")[:-1] if marker else []
    if SUBMIT not in command or sorted(command[command.index(SUBMIT) + 1:]) != sorted(args):
        return None  # not the shape this module relies on: let spark-submit do it
    head = command[:command.index(SUBMIT) + 1]
    if not any("ArchiveClassesAtExit" in part for part in head):  # a one-off dump path never repeats
        cache.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=cache.parent, delete=False, encoding="utf-8") as tmp:
            json.dump(head, tmp)
        os.replace(tmp.name, cache)
    return head


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as pyspark does: Ctrl-C is the driver's to handle


def launch_gateway(conf: dict[str, str]) -> Any:
    """pyspark's ``launch_gateway`` for ``conf``, without spark-submit's scripts when possible (see the module
    docstring); the gateway's ``proc`` is the driver JVM."""
    from pyspark import SparkConf
    from pyspark.find_spark_home import _find_spark_home
    from pyspark.java_gateway import launch_gateway as pyspark_launch

    spark_home = os.environ.get("SPARK_HOME") or _find_spark_home()  # type: ignore[no-untyped-call]
    java_home = os.environ.get("JAVA_HOME", "")
    args = _submit_args(conf)
    unusual = (os.name != "posix" or not java_home or "PYSPARK_GATEWAY_PORT" in os.environ
               or "PYSPARK_SUBMIT_ARGS" in os.environ
               or Path(os.environ.get("SPARK_CONF_DIR", os.path.join(spark_home, "conf")), "spark-env.sh").exists())
    head = None if unusual else _driver_command(spark_home, java_home, conf, args)
    if head is None:
        return pyspark_launch(SparkConf(loadDefaults=False).setAll(list(conf.items())))  # type: ignore[no-untyped-call]
    return _start(head + args, spark_home)


def _start(command: list[str], spark_home: str) -> Any:
    """Run the driver JVM and connect to its gateway (pyspark's launch_gateway, from its Popen on)."""
    from py4j.clientserver import ClientServer, JavaParameters, PythonParameters
    from py4j.java_gateway import GatewayParameters, JavaGateway, java_import
    from pyspark.errors import PySparkRuntimeError
    from pyspark.serializers import UTF8Deserializer, read_int

    conn_dir = tempfile.mkdtemp()
    try:
        conn_file = os.path.join(conn_dir, "conn")
        env = dict(os.environ, SPARK_HOME=spark_home, _PYSPARK_DRIVER_CONN_INFO_PATH=conn_file)
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, env=env, preexec_fn=_ignore_sigint)  # noqa: PLW1509 - signal only
        while proc.poll() is None and not os.path.isfile(conn_file):
            time.sleep(0.02)
        if not os.path.isfile(conn_file):
            raise PySparkRuntimeError(error_class="JAVA_GATEWAY_EXITED", message_parameters={})
        with open(conn_file, "rb") as info:
            port = read_int(info)  # type: ignore[no-untyped-call]
            secret = UTF8Deserializer().loads(info)  # type: ignore[no-untyped-call]
    finally:
        shutil.rmtree(conn_dir, ignore_errors=True)
    if os.environ.get("PYSPARK_PIN_THREAD", "true").lower() == "true":
        gateway: Any = ClientServer(java_parameters=JavaParameters(port=port, auth_token=secret, auto_convert=True),
                                    python_parameters=PythonParameters(port=0, eager_load=False))
    else:
        gateway = JavaGateway(gateway_parameters=GatewayParameters(port=port, auth_token=secret, auto_convert=True))
    gateway.proc = proc
    for name in ("org.apache.spark.SparkConf", "org.apache.spark.api.java.*", "org.apache.spark.api.python.*",
                 "org.apache.spark.ml.python.*", "org.apache.spark.mllib.api.python.*", "org.apache.spark.resource.*",
                 "org.apache.spark.sql.*", "org.apache.spark.sql.api.python.*", "org.apache.spark.sql.hive.*",
                 "scala.Tuple2"):
        java_import(gateway.jvm, name)
    return gateway
