"""Processes as the tests see them through /proc."""

from __future__ import annotations

from pathlib import Path


def process_group(pgid: int) -> list[int]:
    """The live (not zombie, not dead) processes of process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split() if entry.name.isdigit() else []
        except OSError:
            continue
        if fields and fields[0] not in "ZX" and fields[2] == str(pgid):
            members.append(int(entry.name))
    return members
