"""A small OpenAI-compatible judge on loopback whose replies a test scripts, for what the dev server
cannot be made to do: a ``usage`` block sent exactly as given (``100.0``, ``1e12``, ``true``, ...),
and llama-cpp-python's refusal of ``response_format`` json_schema.

llama-cpp-python's server (0.3.x) types ``response_format.type`` as ``Literal["text", "json_object"]``;
FastAPI's validation of a ``json_schema`` request raises ``RequestValidationError`` inside the route,
where the server's ``RouteErrorHandler`` catches every exception and answers HTTP 500
``{"error": {"message": str(exc), "type": "internal_server_error", ...}}``. The message is made
here the same way: pydantic validates the same TypedDict, FastAPI's exception formats the errors.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired

import pydantic
from aiohttp import web
from fastapi.exceptions import RequestValidationError
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

__all__ = ["StandinJudge", "llama_cpp_validation_error", "standin_judge"]


class _LlamaCppResponseFormat(TypedDict):
    """``llama_cpp.llama_types.ChatCompletionRequestResponseFormat`` (0.3.x)."""

    type: Literal["text", "json_object"]
    schema: NotRequired[Any]


_RESPONSE_FORMAT = pydantic.TypeAdapter(_LlamaCppResponseFormat)


def llama_cpp_validation_error(response_format: Any) -> str | None:
    """The message llama-cpp-python's server puts in its HTTP 500 for this ``response_format``, or
    None when it accepts it."""
    try:
        _RESPONSE_FORMAT.validate_python(response_format)
    except pydantic.ValidationError as exc:
        errors = [
            {**error, "loc": ("body", "response_format", *error["loc"])}
            for error in exc.errors(include_url=False)
        ]
        endpoint = {
            "function": "create_chat_completion",
            "path": "POST /v1/chat/completions",
            "file": "/usr/lib/python3/site-packages/llama_cpp/server/app.py",
            "line": 420,
        }
        return str(RequestValidationError(errors, endpoint_ctx=endpoint))  # type: ignore[arg-type]
    return None


@dataclass
class StandinJudge:
    """The scripted judge: every chat completion answers ``content`` with ``usage`` and ``logprobs``
    as given (None: no usage block); with ``llama_cpp`` a ``response_format`` llama-cpp-python
    refuses gets its 500, and ``fail_with``, when set, answers every request with that (status,
    message) instead."""

    content: str = "The response is right.\nRating: [[7]]"
    usage: Any = field(
        default_factory=lambda: {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
    )
    llama_cpp: bool = False
    fail_with: tuple[int, str] | None = None
    logprobs: list[dict[str, Any]] | None = None
    """The reply's ``logprobs.content`` entries as given (None: no ``logprobs``)."""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        if self.fail_with is not None:
            status, message = self.fail_with
            return _error(status, message)
        if self.llama_cpp and "response_format" in body:
            refusal = llama_cpp_validation_error(body["response_format"])
            if refusal is not None:
                return _error(500, refusal)
        reply: dict[str, Any] = {
            "id": "chatcmpl-standin",
            "object": "chat.completion",
            "model": body.get("model", "judge"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": self.content},
                    "finish_reason": "stop",
                }
            ],
        }
        if self.logprobs is not None:
            reply["choices"][0]["logprobs"] = {"content": self.logprobs}
        if self.usage is not None:
            reply["usage"] = self.usage
        # json.dumps writes floats as given (100.0 stays 100.0) and NaN as NaN, as Python servers do.
        return web.Response(text=json.dumps(reply), content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    error = {"message": message, "type": "internal_server_error", "param": None, "code": None}
    return web.Response(text=json.dumps({"error": error}), status=status, content_type="application/json")


@asynccontextmanager
async def serve_chat_completions(handler: Any) -> AsyncIterator[str]:
    """``handler`` answering ``POST /v1/chat/completions`` on 127.0.0.1 (a free port) for the body of
    the block, which gets the server's base URL (``http://127.0.0.1:<port>``)."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def standin_judge(**script: Any) -> AsyncIterator[StandinJudge]:
    """A :class:`StandinJudge` listening on 127.0.0.1 (a free port) for the body of the block."""
    judge = StandinJudge(**script)
    async with serve_chat_completions(judge.chat) as judge.url:
        yield judge
