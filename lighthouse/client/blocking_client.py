"""A blocking facade over :class:`AsyncLighthouseClient`, for callers without an event loop.

The asyncio client runs on a loop thread this facade owns; each method submits a coroutine
to it and waits, with a deadline, for the result.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from lighthouse.client.async_client import DEADLINE_GRACE_S, AsyncLighthouseClient
from lighthouse.wire.fence import FenceResponse
from lighthouse.wire.protocol import Quorum

logger = logging.getLogger(__name__)

T = TypeVar("T")


class LighthouseClient:
    """Blocking facade over :class:`AsyncLighthouseClient`, backed by its own loop thread.

    Use as a context manager; every method takes a deadline and may be called from any thread.
    """

    def __init__(self, address: str, replica_id: str, **kwargs: Any) -> None:
        self._address = address
        self._replica_id = replica_id
        self._kwargs = kwargs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: AsyncLighthouseClient | None = None

    @property
    def client(self) -> AsyncLighthouseClient:
        assert self._client is not None, "start() the client first"
        return self._client

    def start(self) -> LighthouseClient:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"lighthouse-client-{self._replica_id}", daemon=True
        )
        self._thread.start()

        async def build() -> AsyncLighthouseClient:
            client = AsyncLighthouseClient(self._address, self._replica_id, **self._kwargs)
            await client.start()
            return client

        self._client = self._run(build(), 10.0)
        return self

    def close(self, timeout_s: float = 5.0) -> None:
        if self._loop is None:
            return
        if self._client is not None:
            try:
                self._run(self._client.close(), timeout_s)
            except concurrent.futures.TimeoutError:
                logger.warning("lighthouse client of %s did not close within %gs", self._replica_id, timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(timeout_s)
        self._loop = None

    def __enter__(self) -> LighthouseClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def record_progress(self, step: int) -> None:
        self.client.progress.record(step)

    def wait_registered(self, timeout_s: float) -> None:
        self._run(self.client.wait_registered(timeout_s), timeout_s + DEADLINE_GRACE_S)

    def quorum(self, step: int, timeout_s: float, **kwargs: Any) -> Quorum:
        return self._run(self.client.quorum(step, timeout_s, **kwargs), timeout_s + 2 * DEADLINE_GRACE_S)

    def fence(self, quorum_id: int, step: int, timeout_s: float) -> FenceResponse:
        return self._run(self.client.fence(quorum_id, step, timeout_s), timeout_s + DEADLINE_GRACE_S)

    def _run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        assert self._loop is not None, "start() the client first"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)
