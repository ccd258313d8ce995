"""ksi.allocator's trim policy: free pages go back to the system only above the memory ksi expects to hold."""

from __future__ import annotations

import sys

import pytest

from ksi import allocator


class _Libc:
    """Records the malloc_trim calls the policy makes (the real one would hand pages back either way)."""

    def __init__(self) -> None:
        self.trims: list[int] = []

    def malloc_trim(self, pad: int) -> int:
        self.trims.append(pad)
        return 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_resident_bytes_is_the_process_rss() -> None:
    resident = allocator.resident_bytes()
    with open("/proc/self/status") as status:
        vm_rss = next(int(line.split()[1]) << 10 for line in status if line.startswith("VmRSS:"))
    assert resident is not None and resident > 1 << 20
    assert abs(resident - vm_rss) < 16 << 20  # the same figure, read a moment apart


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_trim_only_above_keep_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    libc = _Libc()
    monkeypatch.delenv("KSI_MALLOC_TUNE", raising=False)
    monkeypatch.setattr(allocator, "_glibc", lambda: libc)
    monkeypatch.setattr(allocator, "_last_trim", [0.0])
    resident = allocator.resident_bytes()
    assert resident is not None
    monkeypatch.setattr(allocator, "_keep", [resident * 4])   # far below what ksi may keep: nothing handed back
    allocator.trim()
    assert libc.trims == []
    monkeypatch.setattr(allocator, "_keep", [1 << 20])         # above it: trimmed
    allocator._last_trim[0] = 0.0
    allocator.trim()
    assert libc.trims == [0]
    allocator.trim()                                            # at most every TRIM_EVERY_SECONDS
    assert libc.trims == [0]
    monkeypatch.setattr(allocator, "_keep", [0])                # no keep_bytes: every read's trim, as before
    allocator._last_trim[0] = 0.0
    allocator.trim()
    assert libc.trims == [0, 0]
