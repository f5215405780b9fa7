"""Follow the groups' event files while they are being written.

The runner decides when to inject a fault from what the groups have committed, so it reads
the logs during the run: :class:`EventTail` remembers an offset per file and returns only
complete new lines, so each poll costs what was appended since the last one.

A SIGKILLed rank can leave a truncated last line without its newline; when the group is
restarted, its new process appends to the same file, so its first event (``start``, which
separates incarnations) is glued to the fragment. ``replicaft.events.read_events`` skips the
whole line and would lose that ``start``; here a line that does not parse is retried from its
last ``{"ts":``, which is how every event begins.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_EVENT_START = '{"ts":'


def parse_line(line: str) -> dict[str, Any] | None:
    """One event from one line, recovering an event glued to a truncated predecessor."""
    for candidate in (line, line[line.rfind(_EVENT_START):] if _EVENT_START in line else ""):
        if not candidate:
            continue
        try:
            obj = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(obj, dict) and "event" in obj:
            return obj
    return None


class EventTail:
    """New events from every ``*.jsonl`` file in a directory, each file in its own order."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._offsets: dict[Path, int] = {}

    def poll(self) -> list[dict[str, Any]]:
        """Events appended since the last call (complete lines only). Does not block."""
        events: list[dict[str, Any]] = []
        for path in sorted(self.directory.glob("*.jsonl")):
            offset = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError as e:
                logger.warning("cannot read event file %s: %s; retrying at the next poll", path, e)
                continue
            end = data.rfind(b"\n") + 1
            self._offsets[path] = offset + end
            for raw in data[:end].decode("utf-8", errors="replace").splitlines():
                event = parse_line(raw)
                if event is not None:
                    events.append(event)
        return events


def read_events_dir(directory: Path) -> list[dict[str, Any]]:
    """Every complete event in the directory, file by file (a truncated last line is dropped)."""
    return EventTail(directory).poll()
