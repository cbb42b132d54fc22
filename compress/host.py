"""What this machine's CPU is: its model name and instruction-set flags, from /proc/cpuinfo (empty elsewhere)."""

import platform
import re
from functools import cache
from pathlib import Path


@cache
def cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_model() -> str:
    found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo(), re.M)
    return found.group(1).strip() if found else (platform.processor() or "unknown")


def cpu_flags() -> set[str]:
    found = re.search(r"^flags\s*:\s*(.+)$", cpuinfo(), re.M)
    return set(found.group(1).split()) if found else set()
