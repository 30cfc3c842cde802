"""The local OpenAI-compatible judge and ``/score`` reward service (``async-reward serve``).

Our tests' HTTP peer, the benchmarks' reward service and an offline playground, in four rooms:

* ``server``: :class:`DevServer`, the aiohttp app on the running loop (latency, capacity, faults);
* ``judge``: the pure judging rules (final answer against the reference, verdict rendering);
* ``config``: :class:`DevServerConfig` and the counters behind ``/admin/stats``;
* ``thread`` / ``process``: run it in a daemon thread (:class:`ThreadedDevServer`) or as a child
  process (:class:`ServerProcess`, for benchmarks that must not share the GIL with it).
"""

from __future__ import annotations

from async_reward.tools.devserver.config import FAULT_KINDS, RUNTIME_CONFIG_KEYS, DevServerConfig
from async_reward.tools.devserver.judge import answers_match, extract_final_answer
from async_reward.tools.devserver.process import ServerProcess
from async_reward.tools.devserver.server import DevServer
from async_reward.tools.devserver.thread import ThreadedDevServer, start_in_thread

__all__ = [
    "FAULT_KINDS",
    "RUNTIME_CONFIG_KEYS",
    "DevServer",
    "DevServerConfig",
    "ServerProcess",
    "ThreadedDevServer",
    "answers_match",
    "extract_final_answer",
    "start_in_thread",
]
