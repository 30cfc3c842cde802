#!/usr/bin/env bash
# GSM8K GRPO with pipelined rewards, Megatron actor + vLLM rollout: the async reward agent recipe's
# setup (1 node x 8 GPUs, Qwen2-7B-Instruct, 1024 prompts x 5 responses, mini-batch 256, responses up
# to 1024 tokens, 15 epochs). Needs GPUs and Megatron-Core; not run in CI.
#
#   MINI_BATCH=true ONE_STEP_OFF=true REWARD_FILE=./my_reward.py bash examples/run_gsm8k_grpo_megatron.sh
#
# Same as the FSDP2 script except the trainer config (verl's ppo_megatron_trainer) and parallelism,
# and it uses the legacy reward keys the recipe used (reward_model.reward_manager,
# custom_reward_function.*), which our entry point migrates (verl's own main_ppo ignores them).
set -xeuo pipefail

PYTHON=${PYTHON:-python3}
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2-7B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
REWARD_FILE=${REWARD_FILE:-./reward.py}
REWARD_FN=${REWARD_FN:-compute_score}
MINI_BATCH=${MINI_BATCH:-true}
ONE_STEP_OFF=${ONE_STEP_OFF:-true}
NGPUS=${NGPUS:-8}
EXPERIMENT=${EXPERIMENT:-qwen2_7b_megatron_minibatch_${MINI_BATCH}_offpolicy_${ONE_STEP_OFF}}

$PYTHON -m async_reward.legacy.main_ppo \
    --config-name=ppo_megatron_trainer \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=false \
    critic.enable=false \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=1024 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=true \
    data.truncation=error \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.enable_gradient_checkpointing=true \
    actor_rollout_ref.actor.strategy=megatron \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.ppo_epochs=1 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 \
    actor_rollout_ref.actor.use_kl_loss=true \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.calculate_log_probs=true \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    reward_model.reward_manager=async_naive \
    reward_model.num_workers=8 \
    custom_reward_function.path="$REWARD_FILE" \
    custom_reward_function.name="$REWARD_FN" \
    +reward.async_reward.limits.max_concurrency=32 \
    +reward.async_reward.timeout_s=120 \
    +async_reward.pipeline.mini_batch="$MINI_BATCH" \
    +async_reward.pipeline.one_step_off_policy="$ONE_STEP_OFF" \
    trainer.critic_warmup=0 \
    trainer.logger='["console","tensorboard"]' \
    trainer.project_name=async_reward_gsm8k \
    trainer.experiment_name="$EXPERIMENT" \
    trainer.n_gpus_per_node="$NGPUS" \
    trainer.nnodes=1 \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_epochs=15 \
    "$@"
