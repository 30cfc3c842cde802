"""How async-reward plugs into verl and Ray: the verl plugin and the Ray setup hook (``verl_plugin``,
``integration``), what a worker imports and when (``worker_imports``), our trainer modes registered
where verl looks them up (``trainer_modes``) and our v1 seams named where a job leaves them unset
(``implied_seams``). Top of the library: it may import everything but the legacy trainer.

Internal apart from the setup hook ``async_reward.wiring.integration.setup_worker`` that a job names
without the plugin ("What is public" in docs/package_structure.md): the rest may move without a
deprecation."""
