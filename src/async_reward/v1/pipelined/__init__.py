"""verl v1 trainer mode ``pipelined``: mini-batch updates as each mini-batch of complete groups is
scored, the next batch generated one step off policy. Its settings (``config``), trainer, agent loop,
the batches in flight (``batches``, ``pool``), when to choose the next batch (``choice``), what the
trainer waits for (``waits``) and the rows left untrained (``untrained``)."""
