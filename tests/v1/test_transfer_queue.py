"""The TransferQueue behaviour the v1 modes rely on, pinned against the real TransferQueue (controller
and a storage unit, ``tq.init`` on the session's Ray cluster, as ``TaskRunnerV1`` starts it).

* Tags merge into a key's tag (our progress tags beside verl's prompt tag).
* Fields: a storage unit keeps each field of a key separately and applies puts one at a time, so
  writers of disjoint fields of one key (the trainer's ``old_log_probs`` and ``entropy``, an
  agent-loop worker's ``rm_scores`` and masks) both survive, whatever their order.
* Tags are not merged atomically: every put, a fields-only one included, reads the key's tag with its
  metadata and writes that whole tag back after storing, so a tag change made in between is lost.
  Nobody changes a trajectory key's tag after verl's write; our prompt-tag writes are tag-only and
  serialised per group (``DecoupledAgentLoopWorker._publish``).
"""

from __future__ import annotations

import pytest
import ray

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_transfer_queue_merges_progress_tags_into_verls_prompt_tag(transfer_queue):
    """Our worker writes only its own keys on a prompt's tag; TransferQueue merges them into verl's
    (``is_prompt``, ``status``, ``global_steps`` survive), a later write of verl's keeps ours, and a
    reset on resume (``None`` values) is accepted. Pins the behaviour the window reads."""
    import asyncio

    import transfer_queue as tq

    verl_tag = {"is_prompt": True, "status": "pending", "global_steps": 3}
    tq.kv_batch_put(keys=["pin"], partition_id="train", tags=[verl_tag])
    try:
        asyncio.run(
            tq.async_kv_put(key="pin", partition_id="train", tag={"gen_done": 1, "gen_n": 2, "unscored": 1})
        )
        asyncio.run(tq.async_kv_put(key="pin", partition_id="train", tag={"status": "finished"}))
        tag = tq.kv_list("train")["train"]["pin"]
        assert tag == {**verl_tag, "status": "finished", "gen_done": 1, "gen_n": 2, "unscored": 1}
        tq.kv_batch_put(keys=["pin"], partition_id="train", tags=[{"gen_done": 0, "gen_version": None}])
        assert tq.kv_list("train")["train"]["pin"]["gen_version"] is None
    finally:
        tq.kv_clear(keys=["pin"], partition_id="train")


@ray.remote
class FieldWriter:
    """Writes fields to keys from its own process and TransferQueue client, as an agent-loop worker
    writes a session's ``rm_scores`` and masks."""

    def __init__(self) -> None:
        import transfer_queue as tq

        tq.init()

    def ready(self) -> bool:
        return True

    async def write(self, keys: list[str], names: list[str], rounds: int) -> int:
        return await write_rounds(keys, names, rounds)


async def write_rounds(keys: list[str], names: list[str], rounds: int) -> int:
    """``rounds`` puts of the fields ``names`` to ``keys``, round r writing the value r (a field's last
    value is ``rounds``)."""
    import torch
    import transfer_queue as tq
    from tensordict import TensorDict

    for value in range(1, rounds + 1):
        data = {name: torch.full((len(keys), 3), float(value)) for name in names}
        await tq.async_kv_batch_put(
            keys=keys, partition_id="train", fields=TensorDict(data, batch_size=len(keys))
        )
    return rounds


def test_transfer_queue_keeps_disjoint_fields_written_to_one_key_concurrently(transfer_queue):
    """The write pattern of the v1 modes: an agent-loop worker (a Ray actor) writes ``rm_scores`` and
    ``response_mask`` to a batch's keys while the trainer writes ``old_log_probs`` and ``entropy`` to
    the same keys. TransferQueue stores each field of a key separately and a storage unit applies puts
    one at a time, so every field keeps its writer's last value and verl's tag survives the
    write-backs (each put writes back the tag it read; nobody changed it in between)."""
    import asyncio

    import transfer_queue as tq

    keys = [f"race_{i}_0_0" for i in range(4)]
    tag = {"status": "success", "global_steps": 1}
    tq.kv_batch_put(keys=keys, partition_id="train", tags=[dict(tag) for _ in keys])
    writer = FieldWriter.remote()
    try:
        ray.get(writer.ready.remote())
        rounds = 30
        remote = writer.write.remote(keys, ["rm_scores", "response_mask"], rounds)

        async def trainer_side() -> None:
            await asyncio.gather(
                write_rounds(keys, ["old_log_probs"], rounds), write_rounds(keys, ["entropy"], rounds)
            )

        asyncio.run(trainer_side())
        assert ray.get(remote) == rounds
        fields = ["rm_scores", "response_mask", "old_log_probs", "entropy"]
        data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=fields)
        for name in fields:
            assert data[name].eq(float(rounds)).all(), name
        listing = tq.kv_list("train")["train"]
        assert all(listing[key] == tag for key in keys)
    finally:
        ray.kill(writer, no_restart=True)
        tq.kv_clear(keys=keys, partition_id="train")


def test_transfer_queue_writes_back_the_tag_a_field_put_read(transfer_queue):
    """What a concurrent tag write can lose: ``kv_batch_put(fields=...)`` reads each key's tag with its
    metadata and writes that tag back after storing the fields, whole (the controller replaces a
    key's tag). A tag change made in between is undone. Pinned here because the v1 modes rely on no
    one changing a trajectory key's tag after verl wrote it (prompt tags, which our worker changes,
    only ever get tag-only writes, serialised per group)."""
    import asyncio

    import torch
    import transfer_queue as tq
    from tensordict import TensorDict
    from transfer_queue.interface import _maybe_create_tq_client

    key = "race_tag_0_0"
    tq.kv_batch_put(keys=[key], partition_id="train", tags=[{"status": "running"}])

    async def interleaved() -> None:
        client = _maybe_create_tq_client()
        # kv_batch_put(fields=...), step 1: read the key's metadata (its tag comes with it) ...
        meta = await client.async_kv_retrieve_meta(keys=[key], partition_id="train", create=True)
        # ... another writer changes the tag ...
        await tq.async_kv_put(key=key, partition_id="train", tag={"status": "finished"})
        # ... step 2: store the fields and write back the tag read in step 1.
        await client.async_put(TensorDict({"old_log_probs": torch.zeros(1, 3)}, batch_size=1), meta)

    try:
        asyncio.run(interleaved())
        assert tq.kv_list("train")["train"][key]["status"] == "running"
    finally:
        tq.kv_clear(keys=[key], partition_id="train")


def test_the_toy_v1_benchmark_attaches_to_a_running_transfer_queue_and_leaves_it_open(transfer_queue):
    """``async_reward_bench.toy.v1_parity`` run where a TransferQueue already runs (a test session, a
    job) attaches to it and does not close it: closing one it only attached to killed the caller's
    controller and left its client ``None`` (a CI run's later TransferQueue tests then failed with
    "has not been initialized yet")."""
    import transfer_queue as tq
    from transfer_queue import interface

    from async_reward_bench.toy.v1_parity import _open_transfer_queue

    controller = ray.get_actor("TransferQueueController", namespace="transfer_queue")
    assert _open_transfer_queue() is False
    assert interface._TQ_CLIENT is not None
    still_running = ray.get_actor("TransferQueueController", namespace="transfer_queue")
    assert still_running._actor_id == controller._actor_id
    tq.kv_batch_put(keys=["attach_probe"], partition_id="train", tags=[{"probe": 1}])
    try:
        assert tq.kv_list("train")["train"]["attach_probe"]["probe"] == 1
    finally:
        tq.kv_clear(keys=["attach_probe"], partition_id="train")
