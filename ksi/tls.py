"""TLS contexts for ksi's listeners and for its connections to the cluster, from ``[proxy.tls]`` and
``[upstream.tls]``.  The two sides are independent: TLS from clients and plaintext to a broker on a
private network, or the other way round, or both."""

from __future__ import annotations

import functools
import ssl

from .config import TlsConfig

__all__ = ["TlsSetupError", "client_context", "server_context"]


class TlsSetupError(Exception):
    """A certificate, key or CA file that cannot be loaded; the message names the file."""


def _load(context: ssl.SSLContext, tls: TlsConfig, side: str) -> None:
    try:
        if tls.cert_file is not None:
            context.load_cert_chain(tls.cert_file, tls.key_file)
    except (ssl.SSLError, OSError) as exc:
        raise TlsSetupError(f"{side}: cannot load certificate {tls.cert_file} with key {tls.key_file}: {exc}") from None
    try:
        if tls.ca_file is not None:
            context.load_verify_locations(tls.ca_file)
    except (ssl.SSLError, OSError) as exc:
        raise TlsSetupError(f"{side}: cannot load CA file {tls.ca_file}: {exc}") from None


@functools.cache
def server_context(tls: TlsConfig) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(context, tls, "proxy.tls")
    context.verify_mode = ssl.CERT_REQUIRED if tls.require_client_cert else ssl.CERT_NONE
    return context


@functools.cache
def client_context(tls: TlsConfig) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(context, tls, "upstream.tls")
    context.check_hostname = tls.check_hostname
    return context
