"""The trainer: owns the run. Feeds work, enforces the staleness bound, applies GRPO, pushes weights.

    python trainer.py --run-dir runs/demo --param-server tcp://127.0.0.1:5555 --steps 60
    python trainer.py --run-dir runs/demo --resume          # continue from the last good checkpoint

Sockets (requests to the param server, see wire.py): ping, push_weights, enqueue_work, get_rollouts.
Files: $RUN_DIR/metrics.jsonl (one JSON object per step or evaluation), $RUN_DIR/checkpoints/step_N/,
and at the end $RUN_DIR/final/ (the trained policy in Hugging Face layout, `Trainer.export_policy`).

One step, top to bottom (`Trainer.step`):
  1. Feed. Keep (max_staleness + 1) x prompts_per_step work items in flight, each tagged with
     min_version = our current version, so workers sample them with weights at least that new.
  2. Collect. Take finished rollouts; staleness = (our version) - (version that sampled it).
     THE STALENESS BOUND: a rollout with staleness > max_staleness (or from a version we do not
     have, after a resume) is dropped and counted, never trained on (invariant 1). max_staleness=0
     is strict on-policy GRPO; k allows k versions of lag (asynchronous, off-policy RL).
  3. Update. GRPO advantages per group, the policy loss of grpo.py on the trainer's log-probs, one
     optax step. The trainer's log-probs come from model.token_logprobs, the same function the
     sampler's numbers come from; with the bf16 fix (model.py PRECISION POLICY: fixed rounding
     points + rematerialisation) they are bitwise the sampler's at staleness 0, and we measure that
     every step (mismatch/*). `--no-bf16-fix` switches the fix off in every role to reproduce RLAX's
     failure: the on-policy ratio drifts from 1.
  4. Push the new weights (version = number of optimizer steps), log metrics, maybe evaluate
     (pass@1, pass@8 on held-out problems, sampled by the workers) and checkpoint.

Deviations from the paper: one optimizer step per batch of rollouts (so a "version" is exactly one
optimizer step), and the GRPO variant of grpo.py's defaults (no KL, DAPO token-mean, clip-higher),
all switchable by flags. Preemption: SIGTERM checkpoints and exits; SIGKILL loses the steps since
the last checkpoint; `--resume` continues with the same step, optimizer state and data cursor.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import time
import zlib
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax
from safetensors.numpy import load_file, save_file

import cli
import grpo
import hf_io
import model
import tasks
import wire


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
    """JSONL dataset (see tasks.load_jsonl); "" = the embedded function-synthesis task"""
    seed: int = 0
    """data order seed; with it and the cursor, the problems a run sees are fixed"""
    steps: int = 60
    """optimizer steps to run"""
    resume: bool = False
    """continue from the newest good checkpoint in run_dir/checkpoints (start fresh if there is none)"""
    # --- batch and sampling (sent to the workers inside each work item)
    prompts_per_step: int = 16
    """B: prompts per optimizer step (each sampled group_size times)"""
    temperature: float = 1.0
    """sampling temperature; the trainer's log-probs use the same one"""
    top_p: float = 1.0
    """nucleus sampling; the reported log-probs are always from the full tempered distribution"""
    max_new_tokens: int = 16
    """longest completion (the embedded task's answers are one short line)"""
    seq_len: int = 0
    """T: fixed length of prompt + completion, in sampler and trainer alike; 0 = the model's max"""
    # --- optimizer
    microbatch: int = 128
    """rows (completions) per forward/backward pass; gradients are accumulated over the batch. Lower it
    to save memory; model.py's precision policy makes the log-probs independent of it (bitwise)"""
    lr: float = 2e-4
    """Adam learning rate"""
    max_grad_norm: float = 1.0
    """global gradient-norm clip"""
    # --- staleness (ARCHITECTURE.md "Staleness")
    max_staleness: int = 0
    """k: train only on rollouts at most k versions old; 0 = strict on-policy"""
    push_every: int = 1
    """push weights to the param server every this many steps"""
    # --- numerics
    bf16_fix: bool = True
    """the RLAX fix (model.py PRECISION POLICY); --no-bf16-fix reproduces the mismatch"""
    # --- evaluation and checkpoints
    heldout: int = 128
    """held-out problems per evaluation (pass@8's standard error is about 0.5/sqrt(heldout))"""
    eval_samples: int = 8
    """n samples per held-out problem (pass@1 and pass@8 from them)"""
    eval_greedy: bool = True
    """also decode each held-out problem greedily (temperature 0) and report eval/greedy_pass@1: how far
    sharpening alone could take pass@1 (see README "Results")"""
    eval_every: int = 50
    """evaluate every this many steps (and at the start and the end); 0 = start and end only"""
    checkpoint_every: int = 10
    """checkpoint every this many steps (and on SIGTERM and at the end)"""
    keep_checkpoints: int = 3
    """how many checkpoints to keep"""
    rollout_timeout_s: float = 300.0
    """give up (and say why) if no rollout arrives for this long"""

    def __post_init__(self):
        if min(self.steps, self.prompts_per_step, self.microbatch, self.max_new_tokens, self.push_every, self.heldout,
               self.eval_samples, self.checkpoint_every, self.keep_checkpoints) < 1:
            raise ValueError("steps, prompts_per_step, microbatch, max_new_tokens, push_every, heldout, eval_samples, "
                             "checkpoint_every and keep_checkpoints must be >= 1")
        if self.max_staleness < 0 or self.eval_every < 0 or self.seq_len < 0:
            raise ValueError("max_staleness, eval_every and seq_len must be >= 0")
        if self.temperature <= 0 or not 0 < self.top_p <= 1 or self.lr <= 0:
            raise ValueError("temperature and lr must be > 0 and top_p in (0, 1]")


# ----------------------------------------------------------------------------- the update (pure)

def cast_params(master, dtype):
    """f32 master weights -> the model dtype. Sampler and trainer both run exactly these bf16 values."""
    return jax.tree_util.tree_map(lambda x: x.astype(dtype), master)


def microbatch_weight(mask_BT, total_tokens, total_seqs, total_rows, agg: str):
    """The share of the full-batch loss that one microbatch's loss carries, so that summing weighted
    microbatch losses reproduces grpo.aggregate over the whole batch exactly (gradient accumulation)."""
    if agg == "token_mean":
        return jnp.sum(mask_BT) / jnp.maximum(total_tokens, 1.0)
    if agg == "seq_mean_token_mean":
        return jnp.sum(jnp.any(mask_BT > 0, axis=1)) / jnp.maximum(total_seqs, 1.0)
    return mask_BT.shape[0] / total_rows  # seq_mean_token_sum_norm: / (B * max_len) per row


def make_update(mcfg: model.ModelConfig, gcfg: grpo.GRPOConfig, optimizer, temperature: float):
    """The GRPO step over microbatches: (master, opt_state, microbatches) -> (master, opt_state, logp_BT, aux).

    Each microbatch is one jitted forward + backward (the trainer's graph); gradients are summed with
    the weights above, then one optax update is applied."""

    def loss_fn(master, mb, weight):
        logp_BT = model.token_logprobs(cast_params(master, mcfg.jdtype), mcfg, mb["tokens_BT"], temperature)
        # One optimizer step per batch: the proximal policy pi_old IS the current one, so the
        # ratio pi/pi_old is exactly 1 and only the behaviour correction (pi_old/pi_behav) acts.
        loss, aux = grpo.policy_loss(logp_BT, jax.lax.stop_gradient(logp_BT), mb["adv_B"], mb["mask_BT"],
                                     gcfg, logp_behav_BT=mb["logp_behav_BT"], logp_ref_BT=mb.get("logp_ref_BT"))
        aux = {k: v * weight for k, v in aux.items() if not k.endswith("_BT") and k != "num_tokens"}
        return loss * weight, (logp_BT, aux)

    grad_fn = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
    add = jax.jit(lambda a, b: jax.tree_util.tree_map(jnp.add, a, b))

    @jax.jit
    def apply(master, opt_state, grads):
        updates, opt_state = optimizer.update(grads, opt_state, master)
        return optax.apply_updates(master, updates), opt_state, optax.global_norm(grads)

    def update(master, opt_state, microbatches: list):
        mask_all = np.concatenate([mb["mask_BT"] for mb in microbatches])
        totals = (mask_all.sum(), np.any(mask_all > 0, axis=1).sum(), mask_all.shape[0])
        grads, logps, aux = None, [], {}
        for mb in microbatches:
            weight = microbatch_weight(mb["mask_BT"], *totals, gcfg.loss_agg)
            (loss, (logp_BT, mb_aux)), g = grad_fn(master, mb, weight)
            grads = g if grads is None else add(grads, g)
            logps.append(np.asarray(logp_BT))
            mb_aux["loss"] = loss
            aux = {k: aux.get(k, 0.0) + float(v) for k, v in mb_aux.items()}
        master, opt_state, grad_norm = apply(master, opt_state, grads)
        return master, opt_state, np.concatenate(logps), {**aux, "grad_norm": float(grad_norm)}

    return update


def problem_item(problem: tasks.Problem, item_id: str, cfg: Config, G: int, T: int, version: int,
                 evaluate: bool = False, lineage: str = "", temperature: float | None = None) -> dict:
    """A work item: everything a worker needs to sample and verify one group (wire.ITEM_FIELDS)."""
    return {"item_id": item_id, "prompt": problem.prompt, "tests": problem.tests,
            "entry_point": problem.entry_point, "kind": problem.kind,
            "cases": [list(c) for c in problem.cases] if problem.kind == "io" else [],
            "group_size": G, "seq_len": T, "max_new_tokens": cfg.max_new_tokens, "min_version": version,
            "temperature": cfg.temperature if temperature is None else temperature, "top_p": cfg.top_p,
            "stop": list(problem.stop), "eval": evaluate, "lineage": lineage}


def eval_text(metrics: dict) -> str:
    nan = float("nan")
    return (f"eval pass@1 {metrics['eval/pass@1']:.3f} pass@8 {metrics.get('eval/pass@8', nan):.3f} "
            f"greedy pass@1 {metrics.get('eval/greedy_pass@1', nan):.3f}")


# ----------------------------------------------------------------------------- checkpoints

def save_checkpoint(run_dir: str, step: int, master, opt_state, meta: dict, keep: int) -> str:
    """Atomic: everything is written into step_N.tmp/, then the folder is renamed to step_N/.
    A crash mid-write leaves a .tmp folder that load ignores (invariant 5)."""
    root = os.path.join(run_dir, "checkpoints")
    final, tmp = os.path.join(root, f"step_{step:06d}"), os.path.join(root, f"step_{step:06d}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    tensors = {f"master/{k}": np.asarray(v) for k, v in _flat(master).items()}
    tensors.update({f"opt/{i:04d}": np.asarray(v) for i, v in enumerate(jax.tree_util.tree_leaves(opt_state))})
    save_file(tensors, os.path.join(tmp, "state.safetensors"))
    meta = {**meta, "step": step, "crc32": {k: zlib.crc32(np.ascontiguousarray(v).tobytes())
                                            for k, v in tensors.items()}}
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    for old in sorted(d for d in os.listdir(root) if d.startswith("step_") and not d.endswith(".tmp"))[:-keep]:
        shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    return final


def load_checkpoint(run_dir: str, master_like, opt_like):
    """Newest checkpoint that verifies; a truncated or corrupt one is reported and the previous used."""
    root = os.path.join(run_dir, "checkpoints")
    names = sorted((d for d in os.listdir(root) if d.startswith("step_") and not d.endswith(".tmp")),
                   reverse=True) if os.path.isdir(root) else []
    for name in names:
        path = os.path.join(root, name)
        try:
            with open(os.path.join(path, "meta.json")) as f:
                meta = json.load(f)
            tensors = load_file(os.path.join(path, "state.safetensors"))
            for k, v in tensors.items():
                if zlib.crc32(np.ascontiguousarray(v).tobytes()) != meta["crc32"][k]:
                    raise ValueError(f"checksum mismatch in {k}")
            flat_master = _flat(master_like)
            if set(flat_master) != {k[len("master/"):] for k in tensors if k.startswith("master/")}:
                raise ValueError("parameter names differ from the model's")
            master = _unflat(master_like, {k: tensors[f"master/{k}"] for k in flat_master})
            opt_leaves, treedef = jax.tree_util.tree_flatten(opt_like)
            opt_state = jax.tree_util.tree_unflatten(
                treedef, [jnp.asarray(tensors[f"opt/{i:04d}"]) for i in range(len(opt_leaves))])
            return master, opt_state, meta
        except Exception as e:  # any failure to read means: not a good checkpoint
            print(f"[trainer] checkpoint {path} is unusable ({type(e).__name__}: {e}); trying an older one",
                  flush=True)
    raise FileNotFoundError(f"no usable checkpoint in {root}")


def _flat(tree) -> dict:
    return {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _unflat(like, flat: dict):
    paths, treedef = jax.tree_util.tree_flatten_with_path(like)
    return jax.tree_util.tree_unflatten(treedef, [jnp.asarray(flat[jax.tree_util.keystr(p)]) for p, _ in paths])


# ----------------------------------------------------------------------------- the trainer

class Trainer:
    def __init__(self, cfg: Config, gcfg: grpo.GRPOConfig):
        self.cfg, self.gcfg = cfg, gcfg
        os.makedirs(cfg.run_dir, exist_ok=True)
        self.mcfg, params = hf_io.load_hf(cfg.model, bf16_fix=cfg.bf16_fix)
        self.tokenizer = hf_io.load_tokenizer(cfg.model)
        self.T = cfg.seq_len or self.mcfg.max_seq_len
        if self.T > self.mcfg.max_seq_len:
            raise ValueError(f"seq_len {self.T} exceeds the model's max_seq_len {self.mcfg.max_seq_len}")
        self.ref_params = params if gcfg.kl_beta > 0 else None  # pi_ref: the cold-start policy
        self.master = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params)
        self.optimizer = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(cfg.lr))
        self.opt_state = self.optimizer.init(self.master)
        self.update = make_update(self.mcfg, gcfg, self.optimizer, cfg.temperature)
        self.ref_logprobs = jax.jit(lambda p, t: model.token_logprobs(p, self.mcfg, t, cfg.temperature))
        # Data: the cursor is the index of the next training problem; problem i is fixed by (seed, i).
        if cfg.data:
            problems = tasks.load_jsonl(cfg.data)
            self.train_set, self.heldout = tasks.split_dataset(problems, min(cfg.heldout, len(problems) // 2))
            order = np.random.default_rng(cfg.seed).permutation(len(self.train_set))
            self.problem = lambda i: self.train_set[order[i % len(order)]]
        else:
            stream = tasks.train_problems(cfg.seed)
            self.problem, self.heldout = stream.__getitem__, tasks.heldout_problems(cfg.heldout)
        self.step_n, self.cursor = 0, 0
        self.in_flight: dict[str, dict] = {}   # item_id -> work item, enqueued and not yet used or dropped
        self.ready: list[dict] = []            # received training rollouts not yet used
        self.batch: list[dict] = []            # rollouts chosen for the step being assembled
        self.counts = {k: 0 for k in ("used", "dropped_stale", "duplicate", "filtered_zero_var", "skipped_too_long")}
        self.t_start, self.ps_instance = time.monotonic(), None
        # A lineage names this trainer process's policy history. Version numbers restart from the
        # checkpoint on a resume, so "version 7" alone could be a dead trainer's version 7.
        self.lineage = os.urandom(4).hex()
        self.ps = wire.Client("trainer", cfg.param_server, timeout_s=30)
        has_checkpoint = any(d.startswith("step_") and not d.endswith(".tmp")
                             for d in os.listdir(os.path.join(cfg.run_dir, "checkpoints"))) \
            if os.path.isdir(os.path.join(cfg.run_dir, "checkpoints")) else False
        if cfg.resume and not has_checkpoint:
            self.log("--resume: no checkpoint yet, starting from the initial model")
        if cfg.resume and has_checkpoint:
            self.master, self.opt_state, meta = load_checkpoint(cfg.run_dir, self.master, self.opt_state)
            self.step_n, self.cursor, self.counts = meta["step"], meta["cursor"], meta["counts"]
            self.t_start -= meta.get("time_s", 0.0)  # time_s continues across restarts
            # Items in flight at the checkpoint are sampled again with our (restored) weights.
            self.in_flight = {k: {**v, "min_version": self.step_n, "lineage": self.lineage}
                              for k, v in meta["in_flight"].items()}
            self.rewind_ledger()
            self.log(f"resumed from step {self.step_n} (cursor {self.cursor}, {len(self.in_flight)} items in flight)")
        self.metrics_file = open(os.path.join(cfg.run_dir, "metrics.jsonl"), "a")
        self.ledger = open(os.path.join(cfg.run_dir, "ledger.jsonl"), "a")
        self.stop_requested = False

    # -- plumbing ---------------------------------------------------------------------------------
    def log(self, text: str) -> None:
        print(f"[trainer] {time.strftime('%H:%M:%S')} {text}", flush=True)

    def write_metrics(self, metrics: dict) -> None:
        metrics = {"step": self.step_n, "time_s": round(time.monotonic() - self.t_start, 3), **metrics,
                   **{f"rollouts/{k}": v for k, v in self.counts.items()}}
        try:  # written by launch.sh's supervisor
            with open(os.path.join(self.cfg.run_dir, "restarts.json")) as f:
                metrics.update({f"restarts/{role}": n for role, n in json.load(f).items()})
        except (OSError, ValueError):
            pass
        self.metrics_file.write(json.dumps({k: (float(v) if isinstance(v, (np.floating, jax.Array)) else v)
                                            for k, v in metrics.items()}) + "\n")
        self.metrics_file.flush()

    def check_param_server(self) -> None:
        """A restarted param server (new instance id) lost its queue: give it our weights and our
        in-flight items again. The trainer is the one owner of that state."""
        pong = self.ps.call(wire.Ping(), what="param server liveness")
        if (pong.instance != self.ps_instance or pong.info.get("version") != self.step_n
                or pong.info.get("lineage") != self.lineage):
            if self.ps_instance is not None:
                self.log(f"param server restarted (instance {pong.instance}); re-sending weights and work")
            self.push()
            if self.in_flight:
                self.ps.call(wire.EnqueueWork(list(self.in_flight.values()), requeue=True), what="re-enqueue")
            self.ps_instance = pong.instance

    def record(self, item_id: str, fate: str, step: int | None = None) -> None:
        """The ledger: one line per training prompt's fate (trained, dropped_stale, filtered_zero_var),
        tagged with the step it belongs to, so a checker can prove no prompt was lost or used twice."""
        self.ledger.write(json.dumps({"step": self.step_n + 1 if step is None else step,
                                      "item_id": item_id, "fate": fate}) + "\n")
        self.ledger.flush()

    def rewind_ledger(self) -> None:
        """On resume: forget the fates decided after the checkpoint; those steps are redone."""
        path = os.path.join(self.cfg.run_dir, "ledger.jsonl")
        if os.path.exists(path):
            kept = []
            with open(path) as f:
                for line in f:
                    try:
                        if json.loads(line)["step"] <= self.step_n:
                            kept.append(line)
                    except (ValueError, KeyError):  # a line cut short by SIGKILL
                        pass
            with open(path + ".tmp", "w") as f:
                f.writelines(kept)
            os.replace(path + ".tmp", path)

    def push(self) -> float:
        t0 = time.monotonic()
        tensors = hf_io.to_hf_tensors(cast_params(self.master, self.mcfg.jdtype), self.mcfg)
        names = list(tensors)
        arrays = [np.ascontiguousarray(tensors[n]) for n in names]
        checksums = [zlib.crc32(memoryview(a.reshape(-1).view(np.uint8))) for a in arrays]
        self.ps.call(wire.PushWeights(self.step_n, names, arrays, checksums, self.lineage), what="weights receipt")
        return time.monotonic() - t0

    def enqueue(self, items: list) -> None:
        if items:
            for item in items:
                self.in_flight[item["item_id"]] = item
            self.ps.call(wire.EnqueueWork(items), what="enqueue receipt")

    def feed(self, n_collected: int) -> None:
        """Step 1: keep (max_staleness + 1) x B training items ahead of us: the rest of this step's
        batch plus the next k steps'. Each is tagged with our version, so when it is used (at most k
        steps later) its staleness is at most k, unless a worker was slow (then step 2 drops it)."""
        in_flight = sum(not i["eval"] for i in self.in_flight.values()) + len(self.ready)
        target = (self.cfg.max_staleness + 1) * self.cfg.prompts_per_step - n_collected
        items = []
        while in_flight + len(items) < target:
            problem, index = self.problem(self.cursor), self.cursor
            self.cursor += 1
            if len(self.tokenizer.encode(problem.prompt)) + self.cfg.max_new_tokens > self.T:
                self.counts["skipped_too_long"] += 1
                continue
            items.append(problem_item(problem, f"train/{index}|{problem.item_id}", self.cfg,
                                      self.gcfg.group_size, self.T, self.step_n, lineage=self.lineage))
        self.enqueue(items)

    def receive(self, wait_s: float) -> list:
        """Take finished rollouts, applying THE STALENESS BOUND (step 2 above). Returns eval rollouts;
        training ones go to self.ready."""
        reply = self.ps.call(wire.GetRollouts(max_items=256, wait_s=wait_s), timeout_s=wait_s + 10,
                             what="rollouts")
        evals = []
        for rollout in reply.rollouts:
            try:
                wire.check_rollout(rollout)
            except wire.WireError as e:
                self.log(f"dropping malformed rollout: {e}")
                continue
            item = self.in_flight.pop(rollout["item_id"], None)
            if item is None:  # already used or dropped (e.g. re-issued after a resume): at most once
                self.counts["duplicate"] += 1
                continue
            if item["eval"]:
                evals.append(rollout)
                continue
            staleness = self.step_n - rollout["version"]
            if not 0 <= staleness <= self.cfg.max_staleness or rollout.get("lineage") != self.lineage:
                self.counts["dropped_stale"] += 1  # invariant 1: never trained on
                self.record(rollout["item_id"], "dropped_stale")
                continue
            rollout["_item"] = item
            self.ready.append(rollout)
        return evals

    # -- the algorithm ----------------------------------------------------------------------------
    def collect_batch(self) -> tuple[list, float]:
        """Steps 1-2: B groups of usable rollouts (with DAPO dynamic sampling: mixed-reward groups only,
        refilled up to 4 x B attempts, then whatever we have). The batch under construction lives in
        self.batch, so a param server hiccup (TimeoutError) loses nothing: the next call continues."""
        t0, B, seen, batch = time.monotonic(), self.cfg.prompts_per_step, 0, self.batch
        last_progress = time.monotonic()
        while len(batch) < B:
            self.feed(len(batch))
            self.receive(wait_s=0.5)
            if self.ready:
                last_progress = time.monotonic()
            while self.ready and len(batch) < B:
                rollout = self.ready.pop(0)
                seen += 1
                if self.gcfg.dynamic_sampling and np.ptp(rollout["rewards_G"]) == 0 and seen <= 4 * B:
                    self.counts["filtered_zero_var"] += 1
                    self.record(rollout["item_id"], "filtered_zero_var")
                    continue
                batch.append(rollout)
            if time.monotonic() - last_progress > self.cfg.rollout_timeout_s:
                raise TimeoutError(f"no rollout for {self.cfg.rollout_timeout_s:.0f}s: are workers running "
                                   f"and connected to {self.cfg.param_server}?")
            if self.stop_requested:
                break
        self.batch = []
        return batch, time.monotonic() - t0

    def train_step(self, batch: list) -> dict:
        """Step 3: GRPO update on B groups; returns the step's metrics."""
        G = self.gcfg.group_size
        tokens_BT = np.concatenate([r["tokens_GT"] for r in batch])
        behav_BT = np.concatenate([r["logp_GT"] for r in batch])
        mask_BT = np.concatenate([r["mask_GT"] for r in batch])
        rewards_BG = np.stack([r["rewards_G"] for r in batch])
        staleness_B = np.repeat([self.step_n - r["version"] for r in batch], G)
        lengths_B = mask_BT.sum(1)
        if self.gcfg.overlong_buffer_len > 0:  # DAPO soft overlong punishment, added to the reward
            rewards_BG = rewards_BG + np.asarray(grpo.overlong_penalty(
                lengths_B, self.gcfg.max_len, self.gcfg.overlong_buffer_len,
                self.gcfg.overlong_penalty_factor)).reshape(rewards_BG.shape)
        if self.gcfg.overlong_filter:  # DAPO overlong filtering: truncated completions teach nothing
            finished_B = np.concatenate([r.get("finished_G", np.ones(G, bool)) for r in batch])
            mask_BT = mask_BT * np.asarray(grpo.overlong_mask(lengths_B, self.gcfg.max_len, finished_B))[:, None]
        adv_B = np.asarray(grpo.group_advantages(rewards_BG, self.gcfg)).reshape(-1)
        data = {"tokens_BT": tokens_BT, "adv_B": adv_B, "mask_BT": mask_BT, "logp_behav_BT": behav_BT}
        t0 = time.monotonic()
        microbatches = []
        for i in range(0, len(tokens_BT), self.cfg.microbatch):
            mb = {k: v[i:i + self.cfg.microbatch] for k, v in data.items()}
            if self.ref_params is not None:
                mb["logp_ref_BT"] = self.ref_logprobs(self.ref_params, mb["tokens_BT"])
            microbatches.append(mb)
        self.master, self.opt_state, logp_BT, aux = self.update(self.master, self.opt_state, microbatches)
        train_s = time.monotonic() - t0
        self.step_n += 1
        self.counts["used"] += len(batch)
        for r in batch:
            self.record(r["item_id"], "trained", self.step_n)
        names = {"loss": "loss/total", "pg_loss": "loss/pg", "kl_loss": "loss/kl"}
        metrics = {names.get(k, f"policy/{k}"): float(v) for k, v in aux.items()}
        metrics.update({"reward/mean": float(rewards_BG.mean()), "reward/std": float(rewards_BG.std()),
                        "reward/frac_zero_var_groups": float(np.mean(np.ptp(rewards_BG, axis=1) == 0)),
                        "policy/entropy": float(-(behav_BT * mask_BT).sum() / max(mask_BT.sum(), 1)),
                        "len/completion_mean": float(mask_BT.sum(1).mean()),
                        "staleness/max": int(staleness_B.max()), "staleness/mean": float(staleness_B.mean()),
                        "time/train_s": train_s})
        # THE MEASUREMENT of the bf16 problem: the sampler's log-probs (as it reported them while
        # sampling) against ours inside the gradient computation, on staleness-0 rows only (same weights).
        on_policy = staleness_B == 0
        if on_policy.any():
            mm = grpo.mismatch_metrics(behav_BT[on_policy], logp_BT[on_policy], mask_BT[on_policy])
            metrics.update({f"mismatch/{k}": float(v) for k, v in mm.items()})
        return metrics

    def evaluate(self) -> dict:
        """pass@1 and pass@8 on held-out problems, sampled by the workers at our current version."""
        t0, n = time.monotonic(), self.cfg.eval_samples
        # crn_key: the same random numbers at every evaluation of this run (inference_worker.row_keys),
        # so the change between two evaluations is the weights' doing, not the draw's
        items = [{**problem_item(p, f"eval/{self.step_n}/{j}|{p.item_id}", self.cfg, n, self.T, self.step_n, True,
                                 self.lineage), "crn_key": f"seed{self.cfg.seed}/eval/{j}|{p.item_id}"}
                 for j, p in enumerate(self.heldout)]
        if self.cfg.eval_greedy:  # one greedy completion per problem: the mode of the policy
            items += [problem_item(p, f"evalg/{self.step_n}/{j}|{p.item_id}", self.cfg, 1, self.T, self.step_n,
                                   True, self.lineage, temperature=0.0) for j, p in enumerate(self.heldout)]
        self.enqueue(items)
        pending, correct, greedy = {i["item_id"] for i in items}, [], []
        last_progress = time.monotonic()
        while pending:
            try:
                received = self.receive(wait_s=0.5)
            except (TimeoutError, wire.RemoteError) as e:  # param server restarting: re-send, go on
                self.log(f"{type(e).__name__} during evaluation: {e}; retrying")
                self.check_param_server()
                continue
            for rollout in received:
                if rollout["item_id"] in pending:
                    pending.discard(rollout["item_id"])
                    passed = int((rollout["rewards_G"] >= 1.0).sum())
                    (greedy if rollout["item_id"].startswith("evalg/") else correct).append(passed)
                    last_progress = time.monotonic()
            if time.monotonic() - last_progress > self.cfg.rollout_timeout_s:
                raise TimeoutError(f"evaluation stalled with {len(pending)} problems unanswered")
        c = np.array(correct)
        return {"eval/pass@1": float(grpo.pass_at_k_array(np.full_like(c, n), c, 1).mean()),
                f"eval/pass@{min(8, n)}": float(grpo.pass_at_k_array(np.full_like(c, n), c, min(8, n)).mean()),
                "eval/problems": len(c), "wait/eval_s": time.monotonic() - t0,
                **({"eval/greedy_pass@1": float(np.mean(greedy))} if greedy else {})}

    def checkpoint(self) -> None:
        # Rollouts received but not yet trained on count as in flight: the resumed trainer
        # re-enqueues them (requeue) instead of silently losing their prompts.
        in_flight = {k: v for k, v in self.in_flight.items() if not v["eval"]}
        in_flight.update({r["item_id"]: r["_item"] for r in self.ready + self.batch})
        meta = {"cursor": self.cursor, "counts": self.counts, "seed": self.cfg.seed, "in_flight": in_flight,
                "time_s": time.monotonic() - self.t_start}
        path = save_checkpoint(self.cfg.run_dir, self.step_n, self.master, self.opt_state, meta,
                               self.cfg.keep_checkpoints)
        self.log(f"checkpoint {path}")

    def export_policy(self) -> str:
        """The trained policy as a Hugging Face folder, $RUN_DIR/final: the bf16 weights the workers
        sample with, plus the model folder's tokenizer files. hf_io.load_hf, `warmup.py --report` and
        transformers load it; written beside and renamed into place, so it is whole or absent."""
        out = os.path.join(self.cfg.run_dir, "final")
        tmp = out + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        hf_io.save_hf(tmp, self.mcfg, cast_params(self.master, self.mcfg.jdtype), tokenizer_from=self.cfg.model)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        return out

    def run(self) -> None:
        cfg = self.cfg
        self.check_param_server()
        if self.step_n == 0:
            metrics = self.evaluate()
            self.write_metrics(metrics)
            self.log(f"step 0 | {eval_text(metrics)} on {metrics['eval/problems']} held-out problems")
        while self.step_n < cfg.steps and not self.stop_requested:
            t0 = time.monotonic()
            try:
                self.check_param_server()
                batch, wait_s = self.collect_batch()
            except (TimeoutError, wire.RemoteError) as e:
                # The param server died or restarted: nothing is lost (self.batch, self.ready and
                # self.in_flight are ours); check_param_server re-sends weights and work.
                self.log(f"{type(e).__name__}: {e}; retrying")
                continue
            if self.stop_requested:
                break
            metrics = self.train_step(batch)
            push_s = self.push() if self.step_n % cfg.push_every == 0 else 0.0
            step_s = time.monotonic() - t0
            tokens = sum(float(r["mask_GT"].sum()) for r in batch)
            metrics.update({"wait/rollouts_s": wait_s, "wait/push_s": push_s, "time/step_s": step_s,
                            "throughput/rollouts_per_s": len(batch) * self.gcfg.group_size / step_s,
                            "throughput/tokens_per_s": tokens / step_s})
            if cfg.eval_every and self.step_n % cfg.eval_every == 0 or self.step_n == cfg.steps:
                metrics.update(self.evaluate())
            self.write_metrics(metrics)
            self.log(f"step {self.step_n}: reward {metrics['reward/mean']:.3f} "
                     f"entropy {metrics['policy/entropy']:.3f} "
                     f"bitwise {metrics.get('mismatch/bitwise_frac', float('nan')):.3f} "
                     f"staleness<={metrics['staleness/max']} dropped {self.counts['dropped_stale']} "
                     f"{metrics['throughput/rollouts_per_s']:.0f} rollouts/s {step_s:.2f}s"
                     + (f" | {eval_text(metrics)}" if "eval/pass@1" in metrics else ""))
            if self.step_n % cfg.checkpoint_every == 0 or self.step_n == cfg.steps:
                self.checkpoint()
        if self.step_n == cfg.steps and not self.stop_requested:
            self.log(f"trained policy in {self.export_policy()} (Hugging Face layout)")
        if self.stop_requested:
            self.checkpoint()
            self.log("stopped by SIGTERM after checkpointing")
            raise SystemExit(143)  # not 0: the run is not finished, so a supervisor restarts us


if __name__ == "__main__":
    config, grpo_config = cli.parse(Config, grpo.GRPOConfig)
    try:
        trainer = Trainer(config, grpo_config)
    except (ValueError, FileNotFoundError) as e:  # bad model folder, dataset or checkpoint: say so plainly
        raise SystemExit(f"trainer: cannot start: {e}")
    # Preemption notice: finish the current step, checkpoint, exit (checked between steps).
    signal.signal(signal.SIGTERM, lambda *_: setattr(trainer, "stop_requested", True))
    trainer.run()
