"""`python -m stack.health_probe MODULE`: exit 0 while a `python -m MODULE` process runs here.

The Compose healthcheck of the pipeline's containers; the native stack reads READY log lines.
"""
from __future__ import annotations

import sys
from pathlib import Path

from .processes import command_line


def module_is_running(module: str) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            words = (command_line(int(entry.name)) or "").split()
            if any(words[i:i + 2] == ["-m", module] for i in range(len(words) - 1)):
                return True
    return False


if __name__ == "__main__":
    sys.exit(0 if len(sys.argv) == 2 and module_is_running(sys.argv[1]) else 1)
