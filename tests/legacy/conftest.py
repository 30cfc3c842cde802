"""Fixtures the legacy trainer's tests share with the tests of the rest of the library, defined there
once: importing them here makes them this folder's, so that deleting the folder (with
``src/async_reward/legacy``) leaves nothing behind (docs/package_structure.md)."""

from __future__ import annotations

from tests._core.test_failure_handling import hazards  # noqa: F401  (the scorer's hazards, a module fixture)
from tests.end_to_end.test_entry_point import assets  # noqa: F401  (a tiny model and data, a module fixture)
from tests.judge.in_job.test_in_job import judge_dir, served_judge  # noqa: F401  (the judge served in the job)
