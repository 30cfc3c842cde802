"""Judging a whole GRPO group in one call: the prompt and the reply's per-member verdicts
(``judging``), text planted by one member traced to it (``plants``), where the whole group reaches one
worker (``placement``), and the scoring path of the manager (``scoring``)."""
