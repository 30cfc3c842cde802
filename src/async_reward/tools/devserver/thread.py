"""Running a DevServer on its own event loop in a daemon thread (see ``async_reward.tools.devserver.server``).

Synchronous code (urllib, a notebook) and other processes (Ray workers) reach it over loopback while
the caller's thread stays free.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from async_reward.tools.devserver.config import DevServerConfig
from async_reward.tools.devserver.server import DevServer

__all__ = ["ThreadedDevServer", "start_in_thread"]


class ThreadedDevServer:
    """A DevServer on its own event loop in a daemon thread, for synchronous code and other processes.

    ``with ThreadedDevServer(cfg) as srv: urllib.request.urlopen(srv.url + "/health")``. Every method
    is safe to call from any thread: the work is handed to the server's loop.
    """

    def __init__(
        self,
        config: DevServerConfig | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        timeout_s: float = 30.0,
    ) -> None:
        self.server: DevServer = DevServer(config, host, port)
        self.timeout_s = timeout_s
        """Longest wait for the server's loop to start, stop or answer a call."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        """Start the thread and block until the server listens; returns the base URL."""
        if self._thread is not None:
            raise RuntimeError("ThreadedDevServer already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=self._run_loop, args=(loop,), name="async-reward-devserver", daemon=True
        )
        self._thread.start()
        try:
            return self._call(self.server.start())
        except BaseException:
            self._shutdown_loop()
            raise

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _call(self, coro: Awaitable[Any]) -> Any:
        if self._loop is None:
            raise RuntimeError("ThreadedDevServer is not started")

        async def run() -> Any:
            return await coro

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(self.timeout_s)

    def _call_sync(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        async def run() -> Any:
            return fn(*args, **kwargs)

        return self._call(run())

    def _shutdown_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(self.timeout_s)

    @property
    def url(self) -> str:
        """Base URL (no ``/v1``)."""
        return self.server.url

    def stats(self) -> dict[str, Any]:
        """A snapshot of the counters, like ``GET /admin/stats``."""
        return self._call_sync(lambda: self.server.stats)

    def reset(self) -> None:
        """Zero counters and marker counts and reseed the RNG, like ``POST /admin/reset``."""
        self._call_sync(self.server.reset)

    def update_config(self, /, **changes: Any) -> DevServerConfig:
        """Change runtime fields, like ``POST /admin/config``; ValueError on a bad key or value."""
        return self._call_sync(self.server.update_config, **changes)

    def stop(self) -> None:
        """Stop the server (cancelling requests still inside) and join the thread. Idempotent."""
        if self._loop is None:
            return
        try:
            self._call(self.server.stop())
        finally:
            self._shutdown_loop()

    def __enter__(self) -> ThreadedDevServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_in_thread(
    config: DevServerConfig | None = None, host: str = "127.0.0.1", port: int = 0
) -> ThreadedDevServer:
    """Start a ThreadedDevServer and return it once it listens; call ``.stop()`` when done."""
    server = ThreadedDevServer(config, host, port)
    server.start()
    return server
