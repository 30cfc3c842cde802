"""The local judge server in a child process, for benchmarks.

A real judge runs on another machine. In a benchmark, a server in a thread of the measuring process
competes with the client for the GIL and distorts both; a child process (``async-reward serve``)
does not. The handle mirrors ``ThreadedDevServer`` (``url``, ``stats``, ``reset``,
``update_config``, ``stop``) through the server's ``/admin`` API.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from typing import Any

__all__ = ["ServerProcess"]


class ServerProcess:
    """``async-reward serve`` in a child process on a free loopback port."""

    def __init__(self, *serve_args: str, start_timeout_s: float = 60.0) -> None:
        self._args = [sys.executable, "-m", "async_reward_cli", "serve", "--host", "127.0.0.1", "--port", "0"]
        self._args += list(serve_args)
        self._start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> str:
        """Start the child and return its base URL once it listens."""
        self._process = subprocess.Popen(
            self._args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1
        )
        deadline = time.monotonic() + self._start_timeout_s
        assert self._process.stdout is not None
        while time.monotonic() < deadline:
            line = self._process.stdout.readline()
            if not line:
                break
            for word in line.split():
                if word.startswith("http://"):
                    self.url = word.rstrip("/")
                    return self.url
        self.stop()
        raise RuntimeError(f"the dev server did not report its URL within {self._start_timeout_s} s")

    @property
    def pid(self) -> int | None:
        """The child's process id (None before :meth:`start`)."""
        return self._process.pid if self._process is not None else None

    def _request(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method="GET" if body is None else "POST")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")

    def stats(self) -> dict[str, Any]:
        return self._request("/admin/stats")

    def reset(self) -> None:
        self._request("/admin/reset", {})

    def update_config(self, **changes: Any) -> Any:
        return self._request("/admin/config", changes)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._process is not None and self._process.stdout is not None:
            self._process.stdout.close()
        self._process = None

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
