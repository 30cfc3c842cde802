"""Progress output that fits where it runs: a live bar on a terminal, plain lines in a log.

tqdm redraws its bar in place with carriage returns. On a terminal that is right; in a CI log or a
file behind ``| tee`` every redraw is kept, and the log fills with ``\\r``-joined bars. So
:func:`progress_bar` gives a tqdm bar when the stream is a terminal, and otherwise a
:class:`PlainProgress` that writes whole lines: one when it starts, then at most one every
``period_s`` seconds while it advances, and one when it closes. Every place that shows progress
(``async-reward score`` and ``bench``, the parity benchmark, the pipelined trainer) creates its bar
here.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TextIO

__all__ = [
    "DEFAULT_PERIOD_S",
    "PERIOD_ENV",
    "PlainProgress",
    "ProgressBar",
    "configured_period_s",
    "progress_bar",
]

#: Environment variable overriding the seconds between two plain progress lines.
PERIOD_ENV = "ASYNC_REWARD_PROGRESS_PERIOD_S"
#: Seconds between two plain progress lines when neither the caller nor ``PERIOD_ENV`` says.
DEFAULT_PERIOD_S = 30.0

# tqdm's own fields, without the bar: "scoring:  12% 120/1000 row [00:42<05:10,  2.84row/s, ok=118]".
_LINE_FORMAT = (
    "{desc}{percentage:3.0f}% {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
)
_LINE_FORMAT_NO_TOTAL = "{desc}{n_fmt} {unit} [{elapsed}, {rate_fmt}{postfix}]"


class ProgressBar(Protocol):
    """The part of tqdm's interface our callers use; both kinds of bar provide it."""

    def update(self, n: int = 1) -> Any: ...

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None: ...

    def set_postfix(
        self, ordered_dict: Mapping[str, Any] | None = None, refresh: bool = True, **kwargs: Any
    ) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc_info: object) -> Any: ...


class PlainProgress:
    """Progress as whole lines, for streams that are not terminals (no carriage returns, ever).

    Writes a line on creation, on an ``update`` at least ``period_s`` after the previous line, and on
    ``close`` (the final count, elapsed time and rate). Line fields are tqdm's own formatting.
    """

    def __init__(
        self,
        total: int | None,
        *,
        desc: str = "",
        unit: str = "it",
        initial: int = 0,
        stream: TextIO,
        period_s: float = DEFAULT_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.n = self._initial = initial
        self.period_s = period_s
        """Least seconds between two lines written while advancing."""
        self._stream, self._clock = stream, clock
        self._postfix = ""
        self._closed = False
        self._started = self._last_line = clock()
        self._write_line(self._started)

    def update(self, n: int = 1) -> None:
        """Advance by ``n``; writes a line when ``period_s`` has passed since the previous one."""
        self.n += n
        now = self._clock()
        if now - self._last_line >= self.period_s:
            self._write_line(now)

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        """Label the next lines (``refresh`` is accepted for tqdm's sake; lines come on schedule)."""
        self.desc = desc or ""

    def set_postfix(
        self, ordered_dict: Mapping[str, Any] | None = None, refresh: bool = True, **kwargs: Any
    ) -> None:
        """``key=value`` pairs appended to the next lines, as tqdm shows them."""
        items = {**(ordered_dict or {}), **kwargs}
        self._postfix = ", ".join(f"{key}={value}" for key, value in items.items())

    def close(self) -> None:
        """Write the final line (once)."""
        if not self._closed:
            self._closed = True
            self._write_line(self._clock())

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _write_line(self, now: float) -> None:
        from tqdm import tqdm

        self._last_line = now
        line = tqdm.format_meter(
            self.n,
            self.total,
            now - self._started,
            prefix=f"{self.desc}: " if self.desc else "",
            unit=self.unit,
            postfix=self._postfix or None,
            initial=self._initial,
            bar_format=_LINE_FORMAT if self.total else _LINE_FORMAT_NO_TOTAL,
        )
        self._stream.write(line + "\n")
        self._stream.flush()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def configured_period_s() -> float:
    """Seconds between plain lines: ``PERIOD_ENV`` when set, else :data:`DEFAULT_PERIOD_S`.

    Raises:
        ValueError: ``PERIOD_ENV`` is set to something other than a number >= 0.
    """
    text = os.environ.get(PERIOD_ENV, "").strip()
    if not text:
        return DEFAULT_PERIOD_S
    try:
        period = float(text)
    except ValueError:
        period = -1.0
    if not period >= 0:  # also refuses NaN
        raise ValueError(f"{PERIOD_ENV} must be a number of seconds >= 0, got {text!r}")
    return period


def progress_bar(
    total: int | None,
    *,
    desc: str = "",
    unit: str = "it",
    initial: int = 0,
    enabled: bool = True,
    stream: TextIO | None = None,
    period_s: float | None = None,
) -> ProgressBar:
    """A progress bar on ``stream`` (default stderr) that suits it.

    A terminal gets tqdm's live bar; anything else (a pipe, a file, a CI log) gets
    :class:`PlainProgress` lines every ``period_s`` seconds (None: :func:`configured_period_s`).
    ``enabled=False`` gives a bar that shows nothing.
    """
    out: TextIO = sys.stderr if stream is None else stream
    if enabled and not _is_terminal(out):
        period = configured_period_s() if period_s is None else period_s
        return PlainProgress(total, desc=desc, unit=unit, initial=initial, stream=out, period_s=period)
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc or None,
        unit=unit,
        initial=initial,
        file=out,
        disable=not enabled,
        dynamic_ncols=True,
    )
