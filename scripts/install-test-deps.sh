#!/usr/bin/env bash
# Installs what the integration tests drive besides Python packages:
#   - Debian's kcat (librdkafka's command-line client), via scripts/install-kcat.sh, only when it is missing;
#   - Debian's HAProxy, the TCP load balancer in front of several ksi instances (tests/integration/test_scaleout.py,
#     bench/scaleout.py), via apt-get, only when it is missing (its service is not started);
#   - kafkajs, via npm, into tests/integration/clients/node_modules (from package-lock.json);
#   - Debian's prometheus, which scrapes a running ksi in the Grafana dashboard's test (examples/grafana).
#   - the Java client, Flink's Kafka source and Go's Sarama and kafka-go (scripts/install-jvm-deps.sh).
# Idempotent: a second run changes nothing and takes about a second.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
clients="$root/tests/integration/clients"

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

bash "$root/scripts/install-kcat.sh"

# Only the binary is used (the test runs its own prometheus on a free port); policy-rc.d or the lack of an
# init system keeps the package's service from starting, and --no-install-recommends leaves out exporters.
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    echo "install-test-deps: installing prometheus (Debian package)"
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus
fi

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
echo "install-test-deps: kcat $(kcat -V 2>/dev/null | sed -n 's/^Version \([^ ]*\).*/\1/p'), haproxy $("$(haproxy_bin)" -v | sed -n '1s/^HAProxy version \([^ ]*\).*/\1/p'), kafkajs $(node -p "require('$clients/node_modules/kafkajs/package.json').version"), prometheus $(prometheus --version 2>&1 | sed -n 's/^prometheus, version \([^ ]*\).*/\1/p')"
bash "$root/scripts/install-jvm-deps.sh"
