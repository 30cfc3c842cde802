"""What ships beside the library for people, not for training jobs: the command line (``cli``),
offline scoring of a JSONL file (``offline_score``, ``offline_rows``) and the local judge and reward
server (``devserver``). Nothing in the library imports them.

Internal: nothing here is public API ("What is public" in docs/package_structure.md); it may move
without a deprecation."""
