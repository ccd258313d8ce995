"""Fuzzing: bad bytes from clients never take ksi down, never leak, and only ever close the one connection.

Two layers, both with Hypothesis:

* **The running proxy** (ksi's ``Proxy`` on a trio loop in a background thread, in front of a fake broker
  that, like a real one, closes a connection whose request it cannot parse; two history topics are
  configured, one of them lake-only, so the requests ksi itself decodes, Fetch, ListOffsets, Metadata
  and Produce, are fuzzed too).  Inputs: random bytes; size-prefixed frames with a valid request header
  for every (api key, version) ksi accepts, some it does not, and random, truncated or mutated bodies;
  valid requests with flipped, cut or inserted bytes.  After each input: the proxy thread is alive, ksi
  logged no error and no traceback, a fresh client's ApiVersions and Metadata are answered, every
  connection is gone once its client is, and the metrics' label sets stay bounded.
* **The sans-IO protocol package**: any bytes into framing, header parsing, ``expects_response``,
  response headers, ApiVersions intersection and address rewriting give a result or the package's own
  :class:`protocol.ProtocolError`, never another exception.

The properties are in ``test_fuzz_proxy.py`` (the running proxy) and ``test_fuzz_protocol.py`` (the sans-IO
package); this module holds what both use: the Hypothesis profiles and the request-frame strategies;
``fuzz_target.py`` holds the running proxy and the client that talks to it.

CI runs each property with ``max_examples`` from the ``ci`` profile (well under 30 s in total).  Longer:
``KSI_FUZZ_EXAMPLES=20000 pytest tests/ksi/test_fuzz_proxy.py tests/ksi/test_fuzz_protocol.py`` or
``scripts/fuzz.py --seconds 600`` (make fuzz), which runs these same properties round after round until the
time is up.
"""

from __future__ import annotations

import os
import struct

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from protocol import api, encode_body, known_api, known_api_keys

__all__ = ["ACCEPTED", "KNOWN", "KNOWN_NAMES", "PROFILE", "PURE", "default_body", "examples_run", "headers",
           "mutated", "request_header", "sized"]

# -- how long to fuzz -----------------------------------------------------------------------------------

EXAMPLES = int(os.environ.get("KSI_FUZZ_EXAMPLES", "0") or 0)
# CI: a failure shrinks to one minimal example (shrinking proxy round trips is what takes the time).
settings.register_profile("ci", max_examples=150, deadline=None, print_blob=True, report_multiple_bugs=False,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                 HealthCheck.function_scoped_fixture])
settings.register_profile("long", parent=settings.get_profile("ci"), max_examples=max(EXAMPLES, 1),
                          report_multiple_bugs=True)
PROFILE = settings.get_profile("long" if EXAMPLES else "ci")
# The sans-IO properties are ~1000x cheaper than a proxy round trip: give them more examples.
PURE = settings(PROFILE, max_examples=PROFILE.max_examples * 4)

KNOWN = sorted(known_api_keys())
ACCEPTED = [(k, v) for k in KNOWN for v in range(known_api(k).max_version + 1)]
KNOWN_NAMES = {known_api(k).name for k in KNOWN}

examples_run = {"proxy": 0, "pure": 0}  # read by scripts/fuzz.py


# -- strategies: requests ksi must survive -------------------------------------------------------------


def request_header(api_key: int, version: int, correlation_id: int, client_id: bytes | None, flexible: bool,
            tags: bytes) -> bytes:
    head = struct.pack(">hhi", api_key, version, correlation_id)
    head += struct.pack(">h", -1) if client_id is None else struct.pack(">h", len(client_id)) + client_id
    return head + (tags if flexible else b"")


@st.composite
def headers(draw: st.DrawFn, keys: list[tuple[int, int]] = ACCEPTED) -> tuple[int, int, bytes]:
    """(api key, version, encoded request header): mostly a pair ksi accepts, sometimes one it does not."""
    api_key, version = draw(st.one_of(
        st.sampled_from(keys),
        st.sampled_from(keys).map(lambda kv: (kv[0], kv[1] + 1)),                        # one version too new
        st.tuples(st.integers(0, 0x7FFF), st.integers(0, 40)),                          # any key
        st.tuples(st.integers(-0x8000, 0x7FFF), st.integers(-0x8000, 0x7FFF)),          # anything at all
    ))
    entry = api(api_key)
    flexible = entry is not None and entry.is_flexible(version)
    client_id = draw(st.one_of(st.none(), st.binary(max_size=20), st.just(b"ksi-fuzz")))
    tags = draw(st.one_of(st.just(b"\x00"), st.binary(max_size=8)))
    correlation_id = draw(st.integers(-(1 << 31), (1 << 31) - 1))
    return api_key, version, request_header(api_key, version, correlation_id, client_id, flexible, tags)


def default_body(api_key: int, version: int) -> bytes:
    """A valid body of every field's default for an (api key, version) ksi knows."""
    entry = api(api_key)
    if entry is None or not entry.supports(version):
        return b""
    return encode_body(entry.request(version=version), version)


@st.composite
def mutated(draw: st.DrawFn, data: bytes, start: int = 0) -> bytes:
    """``data`` with a few bytes (from ``start`` on) flipped, cut, inserted or overwritten."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "set", "truncate"]))
        if len(out) <= start:
            kind = "insert"
        at = draw(st.integers(start, max(start, len(out) - 1)))
        if kind == "flip":
            out[at] ^= draw(st.integers(1, 255))
        elif kind == "set":
            value = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF]))
            width = draw(st.integers(1, 4))
            out[at:at + width] = bytes([value]) * width
        elif kind == "cut":
            del out[at:at + draw(st.integers(1, 8))]
        elif kind == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            del out[at:]
    return bytes(out)


def sized(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload
