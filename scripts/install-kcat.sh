#!/usr/bin/env bash
# Installs Debian's kcat (librdkafka's command-line client) when it is missing: the README's first commands
# use it, so `make run` installs it; `make test` drives it in the client matrix.
# Idempotent: a second run changes nothing.
set -euo pipefail

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if ! command -v kcat >/dev/null 2>&1; then
    echo "install-kcat: installing kcat (Debian package)"
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends kcat
fi
kcat -V >/dev/null 2>&1 || { echo "install-kcat: kcat is on PATH but does not run" >&2; exit 1; }
