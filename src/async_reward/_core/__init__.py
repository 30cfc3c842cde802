"""The primitives every part of async-reward stands on: results and statuses, errors, deadlines,
retries, admission (slots, budgets, the job-wide broker), HTTP, running a user's code, redaction.

They take plain parameters (or a small protocol such as :class:`~async_reward._core.limits.LimitSettings`)
and import nothing else of ours, so each can be read, tested and reused alone. Internal: the public
names are re-exported by :mod:`async_reward` and the documented packages.
"""
