"""The Java and Go programs of the integration matrix: where their toolchains and libraries are, and their
builds, cached under ``.cache/jvm`` by a hash of their sources.

* Java: ``tests/integration/java/*.java``, ``examples/flink-backfill/*.java`` and ``bench/java/*.java`` (the
  cold-path benchmark's Java client), compiled with Debian's
  ``javac`` against the jars of the ``shigawire-apache-flink-libraries`` wheel (kafka-clients 3.9.1,
  flink-connector-kafka 4.0.1-2.0, Flink 2.0.0) that ``scripts/install-jvm-deps.sh`` unzips into
  ``.cache/jvm/lib``; logs through Debian's slf4j-simple, to stderr.
* Go: each directory under ``tests/integration/go`` is one program, built in GOPATH mode against Debian's
  packaged sources (``/usr/share/gocode``: Sarama 1.22.1, segmentio kafka-go 0.2.1), offline.

A test that finds something missing fails with the command that installs it.  Run as a script (as the
install script does) it builds everything that is stale and prints what it has.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["CACHE", "INSTALL_HINT", "JvmMissing", "go_binary", "java_command", "run_lines"]

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "jvm"
LIB = CACHE / "lib"
JAVA_SOURCES = [ROOT / "tests" / "integration" / "java", ROOT / "examples" / "flink-backfill", ROOT / "bench" / "java"]
GO_SOURCES = ROOT / "tests" / "integration" / "go"
SLF4J_SIMPLE = Path("/usr/share/java/slf4j-simple.jar")
GOCODE = Path("/usr/share/gocode")
INSTALL_HINT = "run `make test` (or `bash scripts/install-jvm-deps.sh`) to install the Java and Go clients"
BUILD_TIMEOUT_S = 300


class JvmMissing(Exception):
    """A toolchain, jar or package is missing; the message says how to install it."""


def _digest(files: list[Path], extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for f in sorted(files):
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _jars() -> list[Path]:
    if not (LIB / ".complete").is_file():
        raise JvmMissing(f"the Kafka and Flink jars are not in {LIB}: {INSTALL_HINT}")
    jars = sorted(LIB.glob("*.jar"))
    if not SLF4J_SIMPLE.is_file():
        raise JvmMissing(f"{SLF4J_SIMPLE} is missing (Debian package libslf4j-java): {INSTALL_HINT}")
    return [*jars, SLF4J_SIMPLE]


def _replace_stale(prefix: str, keep: Path) -> None:
    for old in keep.parent.glob(prefix + "*"):
        if old != keep:
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)


def java_classes() -> Path:
    """The compiled Java programs (compiled now if their sources changed)."""
    javac = shutil.which("javac")
    if javac is None:
        raise JvmMissing(f"`javac` is not on PATH (Debian package openjdk-17-jdk-headless): {INSTALL_HINT}")
    sources = [f for d in JAVA_SOURCES for f in d.glob("*.java")]
    jars = _jars()
    out = CACHE / f"classes-{_digest(sources, ':'.join(j.name for j in jars))}"
    if (out / ".complete").is_file():
        return out
    building = out.with_name(out.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    done = subprocess.run([javac, "-nowarn", "-encoding", "UTF-8", "-cp", os.pathsep.join(map(str, jars)),
                           "-d", str(building), *map(str, sources)],
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"javac failed:\n{done.stdout}\n{done.stderr}")
    (building / ".complete").touch()
    _replace_stale("classes-", building)
    building.rename(out)
    return out


def java_command(main: str, *args: str, heap: str = "512m", quick_start: bool = True) -> list[str]:
    """``java -cp ... MAIN ARGS``, logging at WARN to stderr; ``quick_start``: the C1 compiler only (a test's
    short run), else the JVM's full JIT (a benchmark's)."""
    java = shutil.which("java")
    if java is None:
        raise JvmMissing(f"`java` is not on PATH: {INSTALL_HINT}")
    classpath = os.pathsep.join(map(str, [java_classes(), *_jars()]))
    return [java, f"-Xmx{heap}", "-XX:+UseSerialGC", *(["-XX:TieredStopAtLevel=1"] if quick_start else []),
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-Dorg.slf4j.simpleLogger.logFile=System.err",
            "-cp", classpath, main, *args]


def go_binary(program: str) -> Path:
    """The built Go program ``tests/integration/go/<program>`` (built now if its source changed)."""
    go = shutil.which("go")
    if go is None:
        raise JvmMissing(f"`go` is not on PATH (Debian package golang-go): {INSTALL_HINT}")
    for package in ("github.com/Shopify/sarama", "github.com/segmentio/kafka-go"):
        if not (GOCODE / "src" / package).is_dir():
            raise JvmMissing(f"{GOCODE}/src/{package} is missing (Debian's golang-github-... package): {INSTALL_HINT}")
    source = GO_SOURCES / program
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=True).stdout
    out = CACHE / "go" / f"{program}-{_digest(sorted(source.glob('*.go')), version)}"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GO111MODULE="off", GOPATH=f"{CACHE / 'gopath'}{os.pathsep}{GOCODE}",
               GOCACHE=str(CACHE / "go-build"), GOPROXY="off", GOFLAGS="", CGO_ENABLED="0")
    building = out.with_name(out.name + ".building")
    done = subprocess.run([go, "build", "-o", str(building), "."], cwd=source, env=env, capture_output=True,
                          text=True, timeout=BUILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"go build {source} failed:\n{done.stdout}\n{done.stderr}")
    _replace_stale(f"{program}-", building)
    building.rename(out)
    return out


def run_lines(argv: list[str], what: str, timeout: float = 120) -> list[dict[str, Any]]:
    """Run a program that prints one JSON object a line; its lines (non-JSON lines are ignored).  A
    non-zero exit or a timeout fails with the program's stderr."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired as exc:
        stderr = (exc.stderr or b"").decode(errors="replace")[-4000:]
        raise AssertionError(f"{what} did not finish in {timeout:.0f} s; stderr:\n{stderr}") from None
    if done.returncode != 0:
        raise AssertionError(f"{what} exited with {done.returncode}\nstdout: "
                             f"{done.stdout.decode(errors='replace')[-3000:]}\n"
                             f"stderr: {done.stderr.decode(errors='replace')[-4000:]}")
    return parse_lines(done.stdout.decode())


def parse_lines(text: str) -> list[dict[str, Any]]:
    lines = []
    for line in text.splitlines():
        start = line.find("{")  # Flink's PrintSink puts "N> " before a line when parallelism > 1
        if start >= 0:
            with contextlib.suppress(json.JSONDecodeError):
                lines.append(json.loads(line[start:]))
    return lines


def main() -> int:
    try:
        classes = java_classes()
        print(f"Java programs in {classes.relative_to(ROOT)}, {len(_jars())} jars on the classpath")
        for program in sorted(p.name for p in GO_SOURCES.iterdir() if p.is_dir()):
            print(f"Go program {program}: {go_binary(program).relative_to(ROOT)}")
    except JvmMissing as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
