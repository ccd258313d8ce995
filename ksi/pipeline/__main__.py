"""``python -m ksi.pipeline archive|compact ...`` (the same as ``ksi archive`` / ``ksi compact``)."""

from __future__ import annotations

import sys

from ..allocator import leave_out_pandas
from .cli import archive_main, compact_main, exit_now

COMMANDS = {"archive": archive_main, "compact": compact_main}

if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
    print("usage: python -m ksi.pipeline archive|compact --config FILE [options]  (--help for each)", file=sys.stderr)
    sys.exit(2)
if sys.argv[1] == "archive":
    leave_out_pandas()  # as ksi archive does (ksi.cli.main)
exit_now(COMMANDS[sys.argv[1]](sys.argv[2:]))
