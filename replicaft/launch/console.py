"""The launcher's terminal: every child's lines, labelled with group and rank, and a live status line.

Children's lines go to stdout, the launcher's own to stderr; on a terminal the status line is
redrawn in place at the bottom of stderr.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import TextIO

TORCHRUN_ROLE = "default"
_TORCHRUN_RANK_LINE = re.compile(rf"^\[{TORCHRUN_ROLE}(\d+)\]:(.*)$")


def label_single_rank_line(replica_id: str, line: str) -> str:
    """Prefix a line of a W=1 group (the script itself) with its group and rank 0."""
    return f"[{replica_id}/0] {line}"


def label_torchrun_line(replica_id: str, line: str) -> str:
    """Prefix a line of torchrun's console with group and rank.

    ``torchrun --tee 3`` prints each worker's lines as ``[default<local_rank>]:text``; lines
    without that prefix are torchrun's own.
    """
    match = _TORCHRUN_RANK_LINE.match(line)
    if match is None:
        return f"[{replica_id}/torchrun] {line}"
    return f"[{replica_id}/{match.group(1)}] {match.group(2)}"


class Console:
    """Serialises the lines of every child, the launcher's log and the status line.

    Children's lines go to ``out``, the launcher's own to ``err``. With ``live`` (stderr is a
    terminal) the status line is drawn in place at the bottom of ``err``: it is erased before
    any other line is written and redrawn on the next :meth:`show_status`.
    """

    def __init__(self, out: TextIO, err: TextIO, *, live: bool) -> None:
        self.out, self.err, self.live = out, err, live
        self._lock = threading.Lock()
        self._status_shown = False
        self._status_text = ""

    def write_line(self, text: str, *, to_err: bool = False) -> None:
        with self._lock:
            self._erase_status()
            stream = self.err if to_err else self.out
            stream.write(text + "\n")
            stream.flush()

    def show_status(self, text: str) -> None:
        if not self.live:
            self.write_line(f"[launcher] status: {text}", to_err=True)
            return
        try:
            width = os.get_terminal_size(self.err.fileno()).columns - 1
        except (OSError, ValueError):
            width = 79
        with self._lock:
            if self._status_shown and text == self._status_text:
                return
            self.err.write("\r\x1b[K" + text[:width])  # a wrapped line could not be erased with \r
            self.err.flush()
            self._status_shown, self._status_text = True, text

    def close(self) -> None:
        with self._lock:
            self._erase_status()

    def _erase_status(self) -> None:
        if self._status_shown:
            self.err.write("\r\x1b[K")
            self.err.flush()
            self._status_shown = False


class ConsoleLogHandler(logging.Handler):
    """Writes the launcher's own log records through the console (so the status line stays intact)."""

    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        self.console.write_line(self.format(record), to_err=True)
