"""``ksi dev``'s data directory: who owns it now, what an earlier run left running, and ``--reset``.

A running ``ksi dev`` writes ``DATA_DIR/ksi-dev.json`` with its own pid and the pids of the processes it
started (each with its kernel start time, so a recycled pid is never mistaken for ours).  Each child leads
a process group of its own, which whatever it starts in turn (the archive's worker pool) joins.  The next
start reads the file: a live ``ksi dev`` on the same directory is refused; the process groups that a killed
one left behind (``kill -9`` gives it no chance to stop them, although its children are also set to die
with it) are stopped, whole, even when their leader is already gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CONFIG_MARKER", "DevState", "DevStateError", "stop_group"]

STATE_FILE = "ksi-dev.json"
CONFIG_MARKER = "# Written by `ksi dev`"


class DevStateError(Exception):
    """The data directory cannot be used (another ksi dev runs there, or it is not ksi dev's)."""


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, pgrp, ...), or None if ``pid`` is
    not running (a zombie is gone, only not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/PID/stat), or None if it is not running."""
    fields = _stat(pid)
    return None if fields is None else fields[19]


def _group_alive(pgid: int) -> bool:
    """Whether any running process is in process group ``pgid``."""
    for entry in Path("/proc").iterdir():
        fields = _stat(entry.name) if entry.name.isdigit() else None
        if fields is not None and fields[2] == str(pgid):
            return True
    return False


@dataclass(frozen=True, slots=True)
class _Process:
    name: str
    pid: int
    started: str

    @classmethod
    def of(cls, name: str, pid: int) -> _Process | None:
        started = _start_time(pid)
        return None if started is None else cls(name, pid, started)

    def alive(self) -> bool:
        return _start_time(self.pid) == self.started

    def left_running(self) -> bool:
        """Whether this process, or any process of the group it led, still runs.  With the leader gone, its
        pid cannot have been given to another process while the group has members (the kernel keeps a
        group's id in use), so such members are ours."""
        if self.alive():
            return True
        return _start_time(self.pid) is None and _group_alive(self.pid)


class DevState:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / STATE_FILE
        self._children: dict[str, _Process] = {}

    # -- what an earlier run left ------------------------------------------------------------------------

    def _recorded(self) -> tuple[_Process | None, list[_Process]]:
        try:
            raw = json.loads(self.path.read_text())
            owner = _Process(**raw["owner"])
            return owner, [_Process(**child) for child in raw.get("children", [])]
        except (OSError, ValueError, KeyError, TypeError):
            return None, []

    def claim(self) -> list[str]:
        """Make the directory this process's.  Raises DevStateError if a live ksi dev holds it; stops what
        a dead one left running and returns a line for each process stopped."""
        owner, children = self._recorded()
        if owner is not None and owner.pid != os.getpid() and owner.alive():
            raise DevStateError(f"another ksi dev (pid {owner.pid}) is running with {self.data_dir}: stop it"
                                f" (Ctrl-C, or kill {owner.pid}) or give this one another --data-dir")
        stopped = []
        for child in children:
            if child.left_running():
                stop_group(child.pid)
                stopped.append(f"stopped the {child.name} (process group {child.pid}) that an earlier ksi dev"
                               " left running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write()
        return stopped

    def add_child(self, name: str, pid: int) -> None:
        process = _Process.of(name, pid)
        if process is not None:
            self._children[name] = process
            self._write()

    def release(self) -> None:
        owner, _ = self._recorded()
        if owner is None or owner.pid == os.getpid():
            with contextlib.suppress(OSError):
                self.path.unlink()

    def _write(self) -> None:
        owner = _Process.of("ksi dev", os.getpid())
        assert owner is not None
        record = {"owner": _as_dict(owner), "children": [_as_dict(c) for c in self._children.values()]}
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(record, indent=1))
        temporary.replace(self.path)

    # -- --reset -------------------------------------------------------------------------------------------

    def reset(self) -> bool:
        """Remove the directory (after ``claim``): broker data, catalog, warehouse, registry, config.
        Refuses a directory that ksi dev did not write.  Returns False if there was nothing to remove."""
        if not self.data_dir.exists():
            return False
        entries = {entry.name for entry in self.data_dir.iterdir()}
        config = self.data_dir / "ksi.toml"
        ours = (config.is_file() and config.read_text(errors="replace").startswith(CONFIG_MARKER)) \
            or entries <= {STATE_FILE, "broker", "broker.log", "registry", "catalog.db", "warehouse"}
        if not ours:
            raise DevStateError(f"--reset: {self.data_dir} does not look like a ksi dev data directory (no ksi.toml"
                                " written by ksi dev); remove it yourself if you mean it")
        shutil.rmtree(self.data_dir)
        self.data_dir.mkdir(parents=True)
        self._write()
        return True


def _as_dict(process: _Process) -> dict[str, object]:
    return {"name": process.name, "pid": process.pid, "started": process.started}


def stop_group(pgid: int, timeout: float = 10.0) -> None:
    """SIGTERM process group ``pgid`` (ksi dev starts each child as the leader of its own), SIGKILL what
    is left of it after ``timeout``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
