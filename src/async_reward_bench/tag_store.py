"""An in-memory stand-in for TransferQueue's key/tag store, so verl's own v1 replay buffer can run.

verl's v1 trainer keeps every prompt group and trajectory in TransferQueue: a prompt key ``{uid}``
whose tag tracks the group's status (``pending`` -> ``running`` -> ``finished`` / ``failure``) and a
key ``{uid}_{session}_{index}`` per trajectory. Its ``ReplayBuffer.sample`` (and
``ReplayBufferAsync.sample``) only lists tags (``tq.kv_list``) and clears keys (``tq.kv_clear``); it
reads values only for DAPO group filtering, which the benchmark does not use. This class serves
exactly those calls from memory, so :func:`serving_replay_buffer` can hand it to verl's unchanged
replay-buffer code. The real TransferQueue is a Ray service; its calls cost milliseconds, which the
benchmark's time scale (1/100 or less) would turn into seconds of recipe time.

Tags merge on every put, as TransferQueue's do (``AgentLoopWorkerTQ`` puts ``{"status": "running"}``
over the trainer's ``{"is_prompt": True, "status": "pending", "global_steps": k}``).
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["TagStore", "serving_replay_buffer"]


class TagStore:
    """Keys with tags (and optional values) per partition; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._writes = 0
        self._tags: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        self._values: dict[str, dict[str, Any]] = defaultdict(dict)

    def kv_put(
        self, key: str, partition_id: str, fields: Any = None, tag: dict[str, Any] | None = None
    ) -> None:
        """Merge ``tag`` into ``key``'s tag; store ``fields`` as its value when given."""
        self.kv_batch_put(
            [key], partition_id, None if fields is None else [fields], None if tag is None else [tag]
        )

    def kv_batch_put(
        self,
        keys: list[str],
        partition_id: str,
        fields: list[Any] | None = None,
        tags: list[dict[str, Any]] | None = None,
    ) -> None:
        if (fields is not None and len(fields) != len(keys)) or (tags is not None and len(tags) != len(keys)):
            raise ValueError("fields and tags must have one entry per key")
        with self._lock:
            partition, values = self._tags[partition_id], self._values[partition_id]
            for i, key in enumerate(keys):
                partition.setdefault(key, {}).update(tags[i] if tags is not None else {})
                if fields is not None:
                    values[key] = fields[i]
            self._note_write()

    def kv_list(self, partition_id: str | None = None) -> dict[str, dict[str, dict[str, Any]]]:
        """``{partition: {key: tag}}``, a snapshot (TransferQueue's ``kv_list`` shape)."""
        with self._lock:
            chosen = [partition_id] if partition_id is not None else list(self._tags)
            return {p: {k: dict(t) for k, t in self._tags.get(p, {}).items()} for p in chosen}

    def kv_clear(self, keys: list[str] | str, partition_id: str) -> None:
        with self._lock:
            for key in [keys] if isinstance(keys, str) else keys:
                self._tags[partition_id].pop(key, None)
                self._values[partition_id].pop(key, None)
            self._note_write()

    def _note_write(self) -> None:
        """Count a write and wake :meth:`wait_for_write`'s callers (the lock is held)."""
        self._writes += 1
        self._changed.notify_all()

    def wait_for_write(self, after: int, timeout: float) -> int:
        """Block until more than ``after`` writes were made (or ``timeout`` seconds pass); return the
        write count. What TransferQueue lacks and a poller of its tags would otherwise sleep for."""
        with self._changed:
            self._changed.wait_for(lambda: self._writes > after, timeout=timeout)
            return self._writes

    def kv_batch_get(self, *args: Any, **kwargs: Any) -> Any:
        """Not served: verl's replay buffer reads values only for DAPO group filtering."""
        raise NotImplementedError(
            "the benchmark's TransferQueue stand-in serves tags only (no DAPO filtering)"
        )

    def values(self, keys: Iterable[str], partition_id: str) -> list[Any]:
        """The stored values of ``keys`` (KeyError for a key without one)."""
        with self._lock:
            stored = self._values[partition_id]
            return [stored[key] for key in keys]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(p) for p in self._tags.values())


@contextlib.contextmanager
def serving_replay_buffer(store: TagStore, *modules: str) -> Iterator[TagStore]:
    """Make verl's v1 replay buffer (``verl.trainer.ppo.v1.replay_buffer``), and the named
    ``modules`` (e.g. a trainer mode of ours that lists tags), use ``store`` as their TransferQueue
    for the duration of the block; each module's own ``tq`` is put back afterwards."""
    import importlib

    patched = [importlib.import_module(name) for name in ("verl.trainer.ppo.v1.replay_buffer", *modules)]
    previous = [getattr(module, "tq") for module in patched]  # noqa: B009 (modules are untyped here)
    for module in patched:
        setattr(module, "tq", store)  # noqa: B010
    try:
        yield store
    finally:
        for module, tq in zip(patched, previous, strict=True):
            setattr(module, "tq", tq)  # noqa: B010
