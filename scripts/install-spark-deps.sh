#!/usr/bin/env bash
# Installs what the PySpark pipeline (ksi archive / ksi compact) and its tests need beyond pip:
#   - Java 17 when no java is on PATH (Debian openjdk-17-jre-headless);
#   - Debian's jarjar (to relocate Jackson for the bundled Iceberg runtime jar), the SQLite JDBC driver with
#     its JNI library, the PostgreSQL JDBC driver, and the PostgreSQL server (one test runs a catalog on it);
#   - the relocated Jackson jar, built once into <venv>/share/ksi/jars by `python -m ksi.pipeline.jars`.
# Idempotent: a second run installs nothing and takes about a second.
#
#   scripts/install-spark-deps.sh [PYTHON]     (default: .venv/bin/python)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${1:-$root/.venv/bin/python}"

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

packages=(libjarjar-java libxerial-sqlite-jdbc-java libxerial-sqlite-jdbc-jni libpostgresql-jdbc-java postgresql)
command -v java >/dev/null 2>&1 || packages+=(openjdk-17-jre-headless)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "install-spark-deps: installing ${missing[*]} (Debian packages)"
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if ! "$python" -c 'import pyspark, pandas, snowpark_connect_deps_iceberg' 2>/dev/null; then
    echo "install-spark-deps: the pipeline's Python packages are missing; installing ksi[spark]"
    "$python" -m pip install --quiet --disable-pip-version-check -e "$root[spark]"
fi
"$python" -m ksi.pipeline.jars | sed 's/^/install-spark-deps: /'
