"""torchft's ``torchft.utils``: the accelerator-neutral stream helpers its modules and users call.

torchft runs its callbacks under the stream that was current when they were scheduled; these
helpers choose CUDA's or XPU's stream API, whichever accelerator is present, and do nothing on
a machine without one. ``record_event`` returns the event it records, as torchft-nightly's
does (callers hand it to another process).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

__all__ = ["get_stream_context", "record_event", "synchronize"]


def get_stream_context(stream: torch.Stream | None) -> AbstractContextManager[object]:
    """A context that makes ``stream`` current on its accelerator; a no-op context for ``None``
    or on a machine with neither CUDA nor XPU."""
    if stream is None:
        return nullcontext()
    if torch.cuda.is_available():
        return torch.cuda.stream(stream)  # type: ignore[arg-type]
    if torch.xpu.is_available():
        return torch.xpu.stream(stream)  # type: ignore[arg-type]
    return nullcontext()


def record_event() -> torch.cuda.Event | torch.xpu.Event | None:
    """Record an event on the current accelerator stream and return it (``None`` without an
    accelerator: the CPU's work is done when the call returns)."""
    if torch.cuda.is_available():
        event = torch.cuda.Event(interprocess=True)
        torch.cuda.current_stream().record_event(event)
        return event
    if torch.xpu.is_available():
        xpu_event = torch.xpu.Event()
        torch.xpu.current_stream().record_event(xpu_event)
        return xpu_event
    return None


def synchronize() -> None:
    """Wait for the current accelerator stream's queued work; nothing to wait for without one."""
    if torch.cuda.is_available():
        torch.cuda.current_stream().synchronize()
    elif torch.xpu.is_available():
        torch.xpu.current_stream().synchronize()
