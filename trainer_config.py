"""trainer_config.py: the trainer's settings, one flag each (`python trainer.py --help` prints them with
these docstrings; cli.py turns the dataclass into flags). The GRPO variant's own settings are
grpo.GRPOConfig. Checked as a whole when made (__post_init__), so a bad combination stops the run
before it loads a model.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import envs
import hf_io
import lora
import scorers


@dataclass
class Config:
    """Trainer settings (the GRPO variant is grpo.GRPOConfig, whose flags are listed too)."""
    # --- run
    run_dir: str = "runs/default"
    """where metrics.jsonl and checkpoints go"""
    param_server: str = "tcp://127.0.0.1:5555"
    """address of the parameter server"""
    model: str = "checkpoints/coldstart"
    """initial policy: a Hugging Face folder (config.json + safetensors)"""
    data: str = ""
    """JSONL dataset (see tasks.load_jsonl: code, math or, with --reward, any rows); "" = the embedded
    function-synthesis task"""
    env: str = ""
    """a multi-turn environment: a name in the registry envs.ENVS (envs/__init__.py; a name it does not
    hold is refused, naming those it does): what answers the model between its turns, up to --max-turns
    model turns; the last turn is scored by the task's reward. Needs the chat format. "": one turn"""
    max_turns: int = 3
    """--env: model turns per episode at most"""
    reward: str = ""
    """path/to/file.py:function: score completions with this function (called by the verifier role, which
    needs the same --reward; launch.sh REWARD passes both): every --data row with a prompt or messages
    is a task, the function gets (completion, row) and returns the reward (scorers.py)"""
    seed: int = 0
    """data order seed; with it and the cursor, the problems a run sees are fixed"""
    curated: str = ""
    """a keep list of problem keys (curate.py's keep.txt: the problems whose pass rate under the
    starting policy lies in a band): training draws only these; the held-out problems are unchanged"""
    skip_uniform: int = 0
    """N > 0: pass over a training problem whose last N groups all had equal rewards (all right or all
    wrong: no gradient) before sampling it again, with probability --skip-prob (tasks.TrainOrder);
    metrics curation/passed_over_uniform, curation/passed_over_not_kept; 0 = off"""
    skip_prob: float = 0.9
    """with --skip-uniform: the probability of passing such a problem over (below 1 it comes back
    now and then, in case the policy has changed on it)"""
    steps: int = 60
    """training steps to run: batches, i.e. policy versions (one optimizer step each unless --ppo-epochs or
    --minibatches > 1)"""
    timeline: str = ""
    """append one JSON line per span of work (wait, train, push, eval, checkpoint) to this file
    (timeline.py); "" = none. launch.sh gives $RUN_DIR/timeline/trainer.jsonl"""
    log_to: str = ""
    """also write every metrics row to "tensorboard" (RUN_DIR/tensorboard), "wandb" (RUN_DIR/wandb; offline
    unless WANDB_MODE says otherwise) or "tensorboard,wandb" (loggers.py; optional extras), names unchanged"""
    resume: bool = False
    """continue from the newest good checkpoint in run_dir/checkpoints (start fresh if there is none)"""
    # --- batch and sampling (sent to the workers inside each work item)
    prompts_per_step: int = 16
    """B: prompts per training step (each sampled group_size times)"""
    temperature: float = 1.0
    """sampling temperature; the trainer's log-probs use the same one"""
    top_p: float = 1.0
    """nucleus sampling; the reported log-probs are always from the full tempered distribution"""
    max_new_tokens: int = 16
    """longest completion (the embedded task's answers are one short line)"""
    seq_len: int = 0
    """T: the rollouts' row length on the wire (prompt + completion + padding) and the longest any row
    may be; each side computes on less (generate sizes its cache to its rows, the update is laid out by
    real length: packing.py). 0 = from the data: the longest prompt plus max_new_tokens, rounded up to
    a power of two (fit_seq_len), at most the model's max; the embedded task uses the model's max"""
    prompt_format: str = ""
    """how a problem becomes the model's text and a completion becomes a program (prompts.py):
    "completion" (base models: the program is prompt + completion) or "chat" (instruction models: the
    problem in the checkpoint's chat template, the program is the answer's fenced code); "" = chat when
    the checkpoint's tokenizer has a chat template, else completion"""
    partial_reward: bool = False
    """stdin/stdout problems: reward the fraction of test cases passed instead of all-or-nothing
    (training only; evaluation stays pass/fail). Metric reward/partial_frac: rewards strictly in (0, 1)"""
    # --- optimizer
    microbatch: int = 0
    """most rows (completions) per forward/backward pass; gradients are accumulated over the batch. Rows
    are grouped by real length, each microbatch cut to its rows' bucket length (packing.py). 0 = the
    most rows of that length that fit --memory-budget-gb (memory.rows_for_budget), at most 128.
    model.py's precision policy makes the log-probs independent of it (bitwise)"""
    pack_min_saving: float = 0.25
    """lay the update out by real length (packing.py: rows grouped by length, each microbatch cut to its
    rows' bucket length) when that computes on at least this share fewer positions than padding every
    row to T; else one fixed shape. Each new (rows, length) shape compiles once, so small savings are
    not worth it. 0 = always by length, 1 = never. Metrics len/padding_frac and len/packed"""
    memory_budget_gb: float = 0.0
    """memory per trainer device for choosing the microbatch; 0 = 80% of the device's (its
    memory_stats bytes_limit), on the CPU half of the machine's RAM (the other roles share it)"""
    lr: float = 2e-4
    """Adam learning rate"""
    max_grad_norm: float = 1.0
    """global gradient-norm clip"""
    ppo_epochs: int = 1
    """PPO epochs: passes of optimizer steps over each batch of rollouts (verl ppo_epochs, TRL
    num_iterations). > 1 lets the ratio pi/pi_old move away from 1, so the clip acts. pi_old is the
    policy before the batch's first optimizer step. A policy version is still one batch (one weight
    push), however many optimizer steps (ppo_epochs x minibatches) it took"""
    minibatches: int = 1
    """optimizer steps per epoch: the batch's rows are split, in order, into this many minibatches of
    whole groups, each its own optimizer step (accumulated over microbatches of `microbatch` rows);
    must divide prompts_per_step"""
    # --- staleness (the rule is lifecycle.usable)
    max_staleness: int = 0
    """k: train only on rollouts at most k versions old when they enter a batch; 0 = strict on-policy.
    With --staleness-target > 0, the ceiling of the bound that sets itself"""
    staleness_target: float = 0.0
    """> 0: the bound sets itself (launch.sh MAX_STALENESS=auto): it starts at 0 and moves by one after
    each step, between 0 and --max-staleness, by lifecycle.AutoStaleness: down when offpolicy/k3_kl
    (policy drift over the stale rows) exceeds this target, up when the trainer waited for rollouts and
    the KL is at most half of it; a bound whose KL was over the target is retried only after several
    starved steps, more each time it fails again. Logged as staleness/limit. launch.sh's
    MAX_STALENESS=auto uses 0.01, the middle of the KL targets PPO's adaptive penalty was run with
    (d_targ 0.003-0.03, Schulman et al. 2017); measured here at staleness 1-2 on the embedded task: 3e-4
    to 9e-3. 0: the bound is --max-staleness, fixed"""
    # --- numerics
    bf16_fix: bool = True
    """the RLAX fix (model.py PRECISION POLICY); --no-bf16-fix reproduces the mismatch"""
    dtype: str = "bfloat16"
    """what the model computes in: "bfloat16" (whatever the checkpoint stores; the precision policy
    makes sampler and trainer log-probs bitwise equal), "float32" (full precision; on XLA:CPU not
    bitwise: mismatch/bitwise_frac 0.76 on the embedded task) or "checkpoint" (the dtype its config.json names).
    Must match the workers' --dtype (launch.sh passes both DTYPE)"""
    # --- LoRA (lora.py; docs/lora.md)
    lora_rank: int = 0
    """r > 0: train a rank-r LoRA adapter (f32 A and B, Adam's state for them alone) on a frozen base held
    in the compute dtype; weight versions after version 0 (the base) carry only the adapter, and the
    workers merge it with lora.merge, as the trainer does (launch.sh LORA_RANK). 0 = full fine-tuning"""
    lora_alpha: float = 0.0
    """LoRA's alpha (scale = alpha / rank); 0 = lora.DEFAULT_ALPHA (32, fixed across ranks as in "LoRA
    Without Regret", so one learning rate serves every rank)"""
    lora_targets: str = ""
    """comma list of the projections that get an adapter, among q_proj,k_proj,v_proj,o_proj,gate_proj,
    up_proj,down_proj; "" = all of them"""
    lora_init: str = ""
    """start from this PEFT adapter folder (adapter_config.json + adapter_model.safetensors, as
    $RUN_DIR/final/adapter holds; hf_io.load_peft_adapter): its adapter is merged into the base (version
    0 is its policy) and a fresh adapter of its rank, alpha and targets trains on top. Its
    adapter_config.json is the run's LoRA config: a --lora-rank, --lora-alpha or --lora-targets given
    beside it must equal the folder's value, else the run is refused at start. Checkpoints record the
    folder and a hash of its adapter; --resume needs the same adapter again. final/adapter holds both as
    one (docs/lora.md)"""
    # --- devices (sharding.py)
    tensor_parallel: int = 1
    """devices per tensor-parallel group: the trainer's visible devices form a (data, tensor) mesh of
    (n / tensor_parallel) x tensor_parallel; master weights, gradients and Adam state are sharded over it
    (FSDP over data), each microbatch's rows over data (padded with empty rows to a multiple of it).
    tensor_parallel > 1 splits matmul sums across devices, so the sampler's log-probs are no longer
    bitwise ours (mismatch/*; sharding.py has the measurements). One device: no mesh, the unsharded program"""
    # --- hosts (multihost.py: one trainer over the chips of several hosts)
    coordinator: str = ""
    """host:port of trainer process 0, which jax.distributed's coordinator listens on ("auto" on a Cloud
    TPU slice: JAX reads it from the VM); "" = one trainer process. The mesh then spans every process's
    devices; process 0 is the trainer the other roles see, the rest take its settings and commands"""
    num_processes: int = 1
    """trainer processes, one per trainer host"""
    process_id: int = 0
    """this trainer process's index (0 = the leader: it alone talks to the param server and writes files)"""
    # --- evaluation and checkpoints
    heldout: int = 128
    """held-out problems per evaluation (pass@8's standard error is about 0.5/sqrt(heldout))"""
    eval_samples: int = 8
    """n samples per held-out problem (pass@1 and pass@8 from them)"""
    eval_greedy: bool = True
    """also decode each held-out problem greedily (temperature 0) and report eval/greedy_pass@1: how far
    sharpening alone could take pass@1 (see docs/results.md)"""
    eval_every: int = 50
    """evaluate every this many steps (and at the start and the end); 0 = start and end only"""
    checkpoint_every: int = 10
    """checkpoint every this many steps (and on SIGTERM and at the end)"""
    keep_checkpoints: int = 3
    """how many checkpoints to keep"""
    rollout_timeout_s: float = 300.0
    """give up (and say why) if no rollout arrives for this long"""
    param_server_timeout_s: float = 30.0
    """how long one call to the param server (a weight chunk's receipt included) may take before the
    trainer treats the server as failed and retries (Trainer.push_trained)"""
    max_verifier_failure_frac: float = 0.5
    """stop the run when more than this fraction of the programs of the last 3 x prompts_per_step
    training groups failed in the verifier (status infra_error), not in the program"""
    audit_frac: float = 0.03125
    """the fraction of arriving training rollouts (the trainer's own draw) whose log-probs it recomputes and whose
    tokens it draws again from their keys (audit.py); one that differs is forged and its worker refused. About 3%
    of a step's time at this default (bench/bench_audit.py); a worker that always lies is caught within about 32
    rollouts. 0: only the prompt/text check every rollout gets"""
    audit_logp_tol: float = 0.0
    """0: an audited rollout's log-probs must be the trainer's bit for bit (bf16 workers with --bf16-fix); > 0:
    the largest mean |delta log p| allowed, and tokens are not drawn again (int8 workers: launch.sh sets it)"""

    def __post_init__(self):
        if min(self.steps, self.prompts_per_step, self.max_new_tokens, self.heldout,
               self.eval_samples, self.checkpoint_every, self.keep_checkpoints) < 1:
            raise ValueError("steps, prompts_per_step, max_new_tokens, heldout, eval_samples, "
                             "checkpoint_every and keep_checkpoints must be >= 1")
        if min(self.max_staleness, self.eval_every, self.seq_len, self.microbatch, self.memory_budget_gb) < 0:
            raise ValueError("max_staleness, eval_every, seq_len, microbatch and memory_budget_gb must be >= 0")
        if not self.staleness_target >= 0:
            raise ValueError(f"staleness_target must be >= 0, got {self.staleness_target}")
        if not 0 <= self.pack_min_saving <= 1:
            raise ValueError(f"pack_min_saving must be in [0, 1], got {self.pack_min_saving}")
        if not 0 <= self.max_verifier_failure_frac <= 1:
            raise ValueError("max_verifier_failure_frac must be in [0, 1]")
        if not 0 <= self.audit_frac <= 1 or not self.audit_logp_tol >= 0:
            raise ValueError("audit_frac must be in [0, 1] and audit_logp_tol >= 0")
        if self.temperature <= 0 or not 0 < self.top_p <= 1 or self.lr <= 0:
            raise ValueError("temperature and lr must be > 0 and top_p in (0, 1]")
        if self.ppo_epochs < 1 or self.minibatches < 1:
            raise ValueError("ppo_epochs and minibatches must be >= 1")
        if self.tensor_parallel < 1:
            raise ValueError(f"tensor_parallel must be >= 1, got {self.tensor_parallel}")
        if self.skip_uniform < 0 or not 0 <= self.skip_prob <= 1:
            raise ValueError(f"skip_uniform must be >= 0 and skip_prob in [0, 1]; got {self.skip_uniform}, {self.skip_prob}")
        if self.curated and not os.path.isfile(self.curated):
            raise ValueError(f"--curated {self.curated}: no such file (curate.py writes keep.txt)")
        hf_io.compute_dtype_override(self.dtype)  # raises on an unknown one
        envs.get(self.env)  # raises on a name the registry does not hold, naming those it does
        if not 1 <= self.max_turns <= 64:
            raise ValueError(f"--max-turns must be in [1, 64], got {self.max_turns}")
        if self.reward:
            if not self.data:
                raise ValueError("--reward scores the rows of a --data file: give one")
            scorers.load_reward(self.reward)  # a file or function that is not there: refuse now, not mid-run
        if not 0 <= self.process_id < self.num_processes:
            raise ValueError(f"process_id {self.process_id} must be in [0, num_processes={self.num_processes})")
        if self.lora_rank < 0 or self.lora_alpha < 0:
            raise ValueError(f"lora_rank and lora_alpha must be >= 0; got {self.lora_rank}, {self.lora_alpha}")
        if self.lora_rank:
            lora.LoraConfig.parse(self.lora_rank, self.lora_alpha, self.lora_targets)  # raises on bad targets
        elif (self.lora_alpha or self.lora_targets) and not self.lora_init:
            raise ValueError("--lora-alpha and --lora-targets need --lora-rank > 0 (or --lora-init)")
        if self.lora_init and not os.path.isdir(self.lora_init):
            raise ValueError(f"--lora-init {self.lora_init}: no such folder")
        if self.lora_init:  # the folder's adapter_config.json is the config: a --lora-* flag may only repeat it
            hf_io.check_lora_flags(self.lora_init, hf_io.read_peft_config(self.lora_init), self.lora_rank,
                                   self.lora_alpha, self.lora_targets)
        if self.prompts_per_step % self.minibatches:
            raise ValueError(f"minibatches={self.minibatches} must divide prompts_per_step={self.prompts_per_step}, "
                             "so that every minibatch (optimizer step) holds the same number of whole groups")
