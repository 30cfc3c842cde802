"""verl v1 trainer mode ``decoupled``: generation and reward scoring run continuously beside training,
bounded by a staleness window. Its settings (``config``), trainer, agent loop, window and replay
buffer."""
