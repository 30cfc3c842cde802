"""Benchmarks of the pipelined trainer schedule (``async-reward bench``).

Importing this package is cheap: torch, verl and Ray are imported by the functions that need them.
"""

from __future__ import annotations

__all__: list[str] = []
