"""The scripted token server of tests/support/v1_standins.py, in a module that imports neither torch
nor verl, so that its Ray actor process starts in about a second of CPU instead of six.

It answers with scripted text, so it needs neither: it tokenizes with the model directory's
``tokenizer.json`` through the ``tokenizers`` library (what verl's tokenizer runs underneath; the same
ids, checked in tests/v1/pipelined/test_pipelined.py), and its answer becomes verl's ``TokenOutput``
when it is unpickled in the agent-loop worker that asked for it (:class:`TokenOutputFields`), where
verl is loaded anyway. Each pytest process that trains starts one of these servers (``rollout`` in
tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import ray

__all__ = [
    "AT_VERSION",
    "GATE",
    "GENERATION_ERROR",
    "SLOW",
    "ScriptTokenizer",
    "ScriptedLLMServer",
    "TokenOutputFields",
]

#: A scripted response starting ``@@sleep:<seconds>@@`` is answered that much later, without the marker.
SLOW = re.compile(r"@@sleep:([0-9.]+)@@")
#: A scripted response starting ``@@version:<k>@@`` (after any ``@@sleep@@``) is answered once the
#: policy version (``set_version``, each weight sync) reaches k, with that version.
AT_VERSION = re.compile(r"@@version:([0-9]+)@@")
#: A scripted response starting with this (after any ``@@sleep@@``) raises in the server instead.
GENERATION_ERROR = "@@error@@"
#: A scripted response starting with this (after any ``@@sleep@@``) is answered once the test calls
#: ``open_gate`` (bounded: 120 s): a cause the test controls, where a delay would race the run.
GATE = "@@gate@@"


class ScriptTokenizer:
    """The model directory's tokenizer as the server needs it: ``encode`` (verl's tokenizer adds no
    special token to this byte-level BPE), ``decode`` (special tokens kept, as verl's default) and the
    ``eos_token_id``, from ``tokenizer.json`` and ``tokenizer_config.json`` alone."""

    def __init__(self, model_dir: str | Path) -> None:
        from tokenizers import Tokenizer

        directory = Path(model_dir)
        self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        eos = json.loads((directory / "tokenizer_config.json").read_text())["eos_token"]
        eos_id = self._tokenizer.token_to_id(eos["content"] if isinstance(eos, dict) else eos)
        if eos_id is None:
            raise ValueError(f"{directory}: eos token {eos!r} is not in tokenizer.json")
        self.eos_token_id: int = eos_id

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))


class _Module:
    """Pickles as ``importlib.import_module(name)``: imported where it is unpickled."""

    def __init__(self, name: str) -> None:
        self.name = name

    def resolve(self) -> Any:
        return importlib.import_module(self.name)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return importlib.import_module, (self.name,)


class _Attribute:
    """Pickles as ``getattr(owner, name)``: a name in a module the sender never imports, looked up
    where it is unpickled. Callable (pickle asks that of a reduce's function): called here, it looks
    the name up here."""

    def __init__(self, owner: _Module | _Attribute, name: str) -> None:
        self.owner, self.name = owner, name

    def resolve(self) -> Any:
        return getattr(self.owner.resolve(), self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return getattr, (self.owner, self.name)


class TokenOutputFields:
    """verl's ``TokenOutput`` (``verl.workers.rollout.replica``) as its fields: unpickled, it is
    ``TokenOutput.model_validate(fields)``, built where verl is loaded (the agent-loop worker that
    receives the answer), so the server never imports verl."""

    def __init__(self, **fields: Any) -> None:
        self.fields = fields

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        token_output = _Attribute(_Module("verl.workers.rollout.replica"), "TokenOutput")
        return _Attribute(token_output, "model_validate"), (self.fields,)


@ray.remote
class ScriptedLLMServer:
    """Stands in for a vLLM replica: the k-th request whose prompt contains a scripted question gets
    that question's k-th response (cycling); sessions of a prompt run concurrently, so which session
    gets which response is not fixed, but each group's set of responses is."""

    def __init__(self, model_dir: str) -> None:
        self.tokenizer = ScriptTokenizer(model_dir)
        self.script: dict[str, list[str]] = {}
        self.calls: dict[str, int] = defaultdict(int)
        self.version = 0
        self.run = 0
        self.gate_open = False
        self.at_gate = 0  # generations of this run waiting at the gate now

    def start(self, script: dict[str, list[str]]) -> None:
        """A new run: its script, call counters and policy version from zero, its gate closed. A
        generation of an earlier run still waiting (for its version or gate) ends (the server is
        shared by the session's runs)."""
        self.script, self.calls, self.version = dict(script), defaultdict(int), 0
        self.gate_open = False
        self.run += 1

    def open_gate(self) -> int:
        """Answer the responses waiting at :data:`GATE` (and any later ones) of this run; returns how
        many were waiting at it."""
        self.gate_open = True
        return self.at_gate

    def set_version(self, version: int) -> None:
        self.version = version

    def requests(self) -> int:
        """Generation requests answered or raised since :meth:`start`."""
        return sum(self.calls.values())

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **_: Any
    ) -> TokenOutputFields:
        prompt = self.tokenizer.decode(prompt_ids)
        question = next((q for q in self.script if q in prompt), None)
        if question is None:
            raise ValueError(f"no scripted response for prompt {prompt!r}")
        responses = self.script[question]
        text = responses[self.calls[question] % len(responses)]
        self.calls[question] += 1
        delay = SLOW.match(text)
        if delay:  # a slow generation: the test needs it to finish after a given point of the run
            await asyncio.sleep(float(delay.group(1)))
            text = text[delay.end() :]
        if text.startswith(GATE):
            run, deadline = self.run, time.monotonic() + 120.0
            self.at_gate += 1
            try:
                while not self.gate_open and time.monotonic() < deadline:
                    if self.run != run:
                        raise RuntimeError("a generation of an earlier run, superseded")
                    await asyncio.sleep(0.02)
            finally:
                self.at_gate -= 1
            text = text[len(GATE) :]
        version = AT_VERSION.match(text)
        if version:  # answered once the policy reaches a version: generated with those weights
            run = self.run
            while self.version < int(version.group(1)):
                if self.run != run:
                    raise RuntimeError("a generation of an earlier run, superseded")
                await asyncio.sleep(0.05)
            text = text[version.end() :]
        if text.startswith(GENERATION_ERROR):  # a replica error: the session raises in generation
            raise RuntimeError(f"scripted generation error for {question!r}")
        token_ids = [*self.tokenizer.encode(text), self.tokenizer.eos_token_id]
        log_probs = [-1.0] * len(token_ids) if sampling_params.get("logprobs") else None
        return TokenOutputFields(
            token_ids=token_ids,
            log_probs=log_probs,
            stop_reason="completed",
            num_preempted=0,
            extra_fields={"global_steps": self.version},
        )
