"""What every trainer of ours shares (the v1 modes and the deprecated legacy trainer): the step
schedule and its protocols (``schedule``), the rows an update may train on under
``on_failure: exclude`` (``exclusion``), the ``reward/*`` metrics (``metrics``) and the schedule
settings common to the trainers (``config``).

Internal: nothing here is public API ("What is public" in docs/package_structure.md); it may move
without a deprecation."""
