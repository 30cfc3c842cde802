"""The lines that say, in the job's log, that something a user turned on is on.

Printed, not logged. On the GPU run of 2026-11-27 (verl's v1 trainer, the judge served in the job)
the in-job judge's capacity line, a ``logging`` warning emitted in verl's task runner, never reached
the job's log, while the line printed beside it by the same process did. A user who cannot see that
the judge was woken, or what admission it got, cannot tell a misconfigured job from a working one, so
these lines take the path that was seen to work: ``print`` to stdout, flushed, which Ray relays to
the driver with the actor's prefix.
"""

from __future__ import annotations

__all__ = ["say_once"]

_SAID: set[str] = set()


def say_once(line: str) -> None:
    """Print ``async_reward: <line>`` once per process (verl's task runner runs our start-up checks
    and hooks several times; one line each is enough)."""
    if line in _SAID:
        return
    _SAID.add(line)
    print(f"async_reward: {line}", flush=True)
