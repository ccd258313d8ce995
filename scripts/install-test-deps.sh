#!/usr/bin/env bash
# Installs the non-Python clients of the integration matrix (tests/integration):
#   - Debian's kcat (librdkafka's command-line client), via apt-get, only when it is missing;
#   - Debian's HAProxy, the TCP load balancer in front of several ksi instances (tests/integration/test_scaleout.py,
#     bench/scaleout.py), via apt-get, only when it is missing (its service is not started);
#   - kafkajs, via npm, into tests/integration/clients/node_modules (from package-lock.json);
#   - the Java client, Flink's Kafka source and Go's Sarama and kafka-go (scripts/install-jvm-deps.sh).
# Idempotent: a second run changes nothing and takes about a second.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
clients="$root/tests/integration/clients"

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if ! command -v kcat >/dev/null 2>&1; then
    echo "install-test-deps: installing kcat (Debian package)"
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends kcat
fi
kcat -V >/dev/null 2>&1 || { echo "install-test-deps: kcat is on PATH but does not run" >&2; exit 1; }

haproxy_bin() { command -v haproxy || { [ -x /usr/sbin/haproxy ] && echo /usr/sbin/haproxy; }; }
if [ -z "$(haproxy_bin)" ]; then
    echo "install-test-deps: installing haproxy (Debian package)"
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends haproxy
fi
"$(haproxy_bin)" -v >/dev/null 2>&1 || { echo "install-test-deps: haproxy is installed but does not run" >&2; exit 1; }

if ! command -v npm >/dev/null 2>&1; then
    echo "install-test-deps: npm is missing (Debian: apt-get install nodejs npm)" >&2
    exit 1
fi
if [ ! -f "$clients/node_modules/kafkajs/package.json" ] \
    || [ "$clients/package-lock.json" -nt "$clients/node_modules/.package-lock.json" ]; then
    echo "install-test-deps: installing kafkajs (npm ci)"
    (cd "$clients" && npm ci --no-audit --no-fund --loglevel=error)
fi
echo "install-test-deps: kcat $(kcat -V 2>/dev/null | sed -n 's/^Version \([^ ]*\).*/\1/p'), haproxy $("$(haproxy_bin)" -v | sed -n '1s/^HAProxy version \([^ ]*\).*/\1/p'), kafkajs $(node -p "require('$clients/node_modules/kafkajs/package.json').version")"
bash "$root/scripts/install-jvm-deps.sh"
