"""The trainer: owns the run. Feeds work, enforces the staleness bound, applies GRPO, pushes weights.

    python trainer.py --run-dir runs/demo --param-server tcp://127.0.0.1:5555 --steps 60
    python trainer.py --run-dir runs/demo --resume          # continue from the last good checkpoint

Sockets (requests to the param server, see wire.py): ping, push_chunk + push_commit (a weight version,
streamed: weights_zmq.push_weights), enqueue_work, get_rollouts.
Files: $RUN_DIR/metrics.jsonl (one JSON object per step or evaluation), $RUN_DIR/ledger.jsonl (one
line per training prompt's final fate), $RUN_DIR/checkpoints/step_N/, and at the end $RUN_DIR/final/
(the trained policy in Hugging Face layout, `Trainer.export_policy`).

One step, top to bottom (`Trainer.run`). Every decision about a rollout or a work item is
lifecycle.py's; this file does the I/O around them.
  1. Feed. Keep (max_staleness + 1) x prompts_per_step training prompts without a fate, each
     tagged with min_version = our current version, so workers sample them with weights at least
     that new (lifecycle.items_to_feed).
  2. Collect. Take finished rollouts into the books; as each one ENTERS the batch its staleness,
     (our version) - (version that sampled it), is checked: THE STALENESS BOUND (lifecycle.usable).
     A rollout staler than max_staleness, or of another trainer lineage, is dropped and counted,
     never trained on; one whose programs the verifier failed on (infra_error) likewise.
     max_staleness=0 is strict on-policy GRPO; k allows k versions of lag (asynchronous RL).
  3. Update. GRPO advantages per group, the policy loss of grpo.py on the trainer's log-probs,
     ppo_epochs x minibatches optax steps (one by default). The trainer's log-probs come from
     model.token_logprobs, the same function the sampler's numbers come from; with the bf16 fix
     (model.py PRECISION POLICY: fixed rounding points + rematerialisation) they are bitwise the
     sampler's at staleness 0, and we measure that every step (mismatch/*). `--no-bf16-fix`
     switches the fix off in every role to reproduce RLAX's failure: the on-policy ratio drifts.
  4. Push the new weights (version = number of batches trained on; a push the param server fails
     is retried like its other failures, so the run keeps its lineage), log metrics, maybe evaluate
     (pass@1, pass@8 on held-out problems, sampled by the workers) and checkpoint.

Deviations from the paper: one optimizer step per batch of rollouts by default (`--ppo-epochs` and
`--minibatches` give several), and the GRPO variant of grpo.py's defaults (no KL, DAPO token-mean,
clip-higher), all switchable by flags. Preemption: SIGTERM checkpoints (the half-collected batch
included) and exits; SIGKILL loses the steps since the last checkpoint; `--resume` continues with the
same step, optimizer state, data cursor and prompts in flight.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import signal
import time

import jax
import numpy as np
import optax

import audit
import checkpointing
import cli
import envs
import grpo
import hf_io
import lifecycle
import loggers
import lora
import model
import multihost
import objectives
import packing
import prompts
import sampler
import sharding
import tasks
from trainer_config import Config
import timeline
import update
import workitems
import weights_zmq
import wire


def eval_text(metrics: dict) -> str:
    nan = float("nan")
    return (f"eval pass@1 {metrics['eval/pass@1']:.3f} pass@8 {metrics.get('eval/pass@8', nan):.3f} "
            f"greedy pass@1 {metrics.get('eval/greedy_pass@1', nan):.3f}")


# ----------------------------------------------------------------------------- the trainer

def weight_metrics(w: dict) -> dict:
    """Where the weight versions' bytes went, from the param server's counts (ParamServer.stats): MiB
    pushed to it, served by it whole and as deltas, served by the workers' relays (running totals); the
    newest version's delta against the whole version's bytes and its positions changed per tensor family
    (deltas.py; absent while none is made); the seconds from the newest synced version's commit until
    every worker held it."""
    if not w:
        return {}
    mib = 1 / 2**20
    out = {"weights/pushed_mib": w["bytes_pushed"] * mib, "weights/served_full_mib": w["bytes_served_full"] * mib,
           "weights/served_delta_mib": w["bytes_served_delta"] * mib, "weights/relayed_mib": w["bytes_relayed"] * mib,
           "weights/sync_s": w["sync_s"]}
    if w["delta_bytes"] >= 0:
        out["weights/delta_frac"] = w["delta_bytes"] / max(w["version_bytes"], 1)
        out.update({f"weights/changed_frac/{fam}": c / max(n, 1) for fam, (c, n) in sorted(w["delta_changed"].items())})
    return out


def weights_text(m: dict) -> str:
    """The step line's weights part: MiB served whole / as deltas / by relays, the newest delta's size
    against the version's, the last sync's seconds."""
    if "weights/pushed_mib" not in m:
        return ""
    delta = f"; newest delta {m['weights/delta_frac']:.3f}x of a version" if "weights/delta_frac" in m else ""
    return (f" | weights served: {m['weights/served_full_mib']:.0f} MiB whole, {m['weights/served_delta_mib']:.1f} "
            f"as deltas, {m['weights/relayed_mib']:.0f} by relays{delta}; synced in {m['weights/sync_s']:.2f}s")


def shaped_rewards(batch, gcfg: grpo.GRPOConfig):
    """(rewards_BG, keep_R) of a batch of rollouts after DAPO's overlong punishment (added to the
    rewards) and overlong filter (keep_R), as gcfg configures them (grpo.shape_rewards). A row's length
    is its longest model turn (grpo.turn_lengths): max_len, like --max-new-tokens, budgets each turn of
    a multi-turn episode, and a one-turn row's only turn is its completion."""
    rewards_BG = np.stack([r.rewards_G for r in batch])
    lengths_R = grpo.turn_lengths(np.concatenate([r.mask_GT for r in batch]))
    finished_R = np.concatenate([r.finished_G for r in batch])
    return tuple(np.asarray(x) for x in grpo.shape_rewards(rewards_BG, lengths_R, finished_R, gcfg))


class Trainer:
    def __init__(self, cfg: Config, gcfg: grpo.GRPOConfig):
        # Across hosts (multihost.py) the leader (process 0) is the trainer the other roles see; every
        # other process takes its settings, builds the same sharded state and then only follows.
        self.leader = multihost.is_leader()
        if jax.process_count() > 1:
            settings = multihost.broadcast([dataclasses.asdict(cfg), dataclasses.asdict(gcfg)])
            cfg = dataclasses.replace(Config(**settings[0]), process_id=cfg.process_id)
            gcfg = grpo.GRPOConfig(**settings[1])
        self.cfg, self.gcfg = cfg, gcfg
        # Our devices: None on one (the unsharded program), else a (data, tensor) mesh over all of them
        self.mesh = sharding.role_mesh(cfg.tensor_parallel)
        params = self.load_model()
        self.build_update(params)
        if not self.leader:
            self.log(f"process {jax.process_index()} of {jax.process_count()}: following the leader")
            return
        os.makedirs(cfg.run_dir, exist_ok=True)
        self.timeline = timeline.Timeline(cfg.timeline, "trainer")
        self.load_data()
        self.auditor = self.make_auditor()
        self.t_start, self.ps_instance = time.monotonic(), None
        # A lineage names this trainer process's policy history. Version numbers restart from the
        # checkpoint on a resume, so "version 7" alone could be a dead trainer's version 7.
        self.lineage = os.urandom(4).hex()
        # Every training prompt without a final fate, and the rules for giving it one (lifecycle.py):
        # the collector decides what to enqueue, what a reply brings, the batch and the checkpoint's
        # share of them; this class does the I/O around it.
        self.books = lifecycle.Books(0 if cfg.staleness_target > 0 else cfg.max_staleness, cfg.prompts_per_step,
                                     self.lineage, self.record)
        self.collector = lifecycle.Collector(self.books, self.training_item)
        # MAX_STALENESS=auto: the bound's controller, with its memory of a bound whose KL was over target
        self.auto_bound = (lifecycle.AutoStaleness(cfg.staleness_target, cfg.max_staleness)
                           if cfg.staleness_target > 0 else None)
        # (infra failures, programs) of recent training groups: is the verifier broken?
        self.verifier_window = collections.deque(maxlen=3 * cfg.prompts_per_step)
        self.step_programs = [0, 0]
        self.queue_stats: dict = {}  # the param server's counts, as the last GetRollouts reply gave them
        self.ps = wire.Client("trainer", cfg.param_server, timeout_s=cfg.param_server_timeout_s)
        ledger_path = os.path.join(cfg.run_dir, "ledger.jsonl")
        self.ledger_lines = 0
        if cfg.resume:
            self.resume(ledger_path)
        self.metrics_file = open(os.path.join(cfg.run_dir, "metrics.jsonl"), "a")
        self.writers = loggers.make_writers(cfg.log_to, cfg.run_dir, {**dataclasses.asdict(cfg),
                                                                     **dataclasses.asdict(gcfg)})
        self.ledger = open(ledger_path, "a")
        self.stop_requested = False

    def run(self) -> None:
        """The loop: (step 0: evaluate), then per step feed + collect (collect_batch), update
        (train_step), push the new version (push_trained), log, evaluate, checkpoint (end_step)."""
        cfg = self.cfg
        self.check_param_server()
        if self.step_n == 0 and (metrics := self.evaluate()):  # {} when a SIGTERM cut it short
            self.write_metrics(metrics)
            self.log(f"step 0 | {eval_text(metrics)} on {metrics['eval/problems']} held-out problems")
        while self.step_n < cfg.steps and not self.stop_requested:
            t0 = time.monotonic()
            try:
                self.check_param_server()
                with self.timeline.span("wait", step=self.step_n + 1):
                    wait_s = self.collect_batch()
            except (TimeoutError, wire.RemoteError) as e:
                # The param server died or restarted: nothing is lost (every prompt without a fate
                # is in self.books); check_param_server re-sends weights and work.
                self.log(f"{type(e).__name__}: {e}; retrying")
                continue
            if self.stop_requested:
                break
            tokens = sum(float(r.mask_GT.sum()) for r in self.books.batch.values())
            with self.timeline.span("train", step=self.step_n + 1):
                metrics = self.train_step()
            push_s = self.push_trained()  # every version is pushed: items of the next step ask for it
            self.end_step(metrics, wait_s, push_s, tokens, time.monotonic() - t0)
        if self.step_n == cfg.steps and not self.stop_requested:
            self.log(f"trained policy in {self.export_policy()} (Hugging Face layout)")
        if self.stop_requested:
            self.checkpoint()
            self.log("stopped by SIGTERM after checkpointing")
            raise SystemExit(143)  # not 0: the run is not finished, so a supervisor restarts us

    def end_step(self, metrics: dict, wait_s: float, push_s: float, tokens: float, step_s: float) -> None:
        """After a step's push: its timings, the staleness bound for the next batch (auto), an
        evaluation when due, the metrics line and log line, a checkpoint when due."""
        cfg = self.cfg
        metrics.update({"wait/rollouts_s": wait_s, "wait/push_s": push_s, "time/step_s": step_s,
                        "throughput/rollouts_per_s": cfg.prompts_per_step * self.gcfg.group_size / step_s,
                        "throughput/tokens_per_s": tokens / step_s, "staleness/limit": self.books.max_staleness,
                        "staleness/wait_frac": wait_s / step_s})
        if cfg.staleness_target > 0:  # the bound for the next batch (this one was admitted under the old)
            self.books.max_staleness = self.auto_bound.update(
                metrics.get("offpolicy/k3_kl"), metrics["staleness/wait_frac"])
        if cfg.eval_every and self.step_n % cfg.eval_every == 0 or self.step_n == cfg.steps:
            metrics.update(self.evaluate())
        self.write_metrics(metrics)
        self.log(f"step {self.step_n}: reward {metrics['reward/mean']:.3f} "
                 f"entropy {metrics['policy/entropy']:.3f} "
                 f"bitwise {metrics.get('mismatch/bitwise_frac', float('nan')):.3f} "
                 f"staleness<={metrics['staleness/max']} dropped {self.books.counts['dropped_stale']} "
                 f"{metrics['throughput/rollouts_per_s']:.0f} rollouts/s {step_s:.2f}s"
                 + weights_text(metrics)
                 + (f" | {eval_text(metrics)}" if "eval/pass@1" in metrics else ""))
        if self.step_n % cfg.checkpoint_every == 0 or self.step_n == cfg.steps:
            self.checkpoint()

    def load_model(self) -> dict:
        """The checkpoint's config, tokenizer and prompt format; returns its weights (on a mesh they
        stay on the host until they go to their shards: no device holds them whole)."""
        cfg, gcfg = self.cfg, self.gcfg
        self.mcfg, params = hf_io.load_hf(cfg.model, bf16_fix=cfg.bf16_fix, host=self.mesh is not None,
                                          **hf_io.compute_dtype_override(cfg.dtype))
        self.tokenizer = hf_io.load_tokenizer(cfg.model)
        self.fmt, self.template = prompts.prompt_format(cfg.model, cfg.prompt_format)
        if cfg.env and self.fmt != "chat":
            raise ValueError(f"--env {cfg.env}: turns and tool outputs are chat messages; use the chat format")
        if cfg.env:  # a template that cannot carry several turns is refused here, never mid-run
            prompts.check_multi_turn(self.template, self.tokenizer)
        if gcfg.max_len > cfg.max_new_tokens:
            raise ValueError(f"--max-len {gcfg.max_len} is the generation budget (Dr. GRPO's and DAPO's L_max): it "
                             f"cannot exceed --max-new-tokens {cfg.max_new_tokens}, or no completion is ever overlong")
        return params

    def build_update(self, params: dict) -> None:
        """The optimizer, the f32 master and its state, the update's graphs and pi_ref's forward.
        LoRA (--lora-rank or --lora-init): the master is the f32 adapter (replicated on a mesh), the
        base stays in the compute dtype (sharded as the master would be), Adam's state is the adapter's."""
        cfg, gcfg = self.cfg, self.gcfg
        self.optimizer = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(cfg.lr))
        ref_policy = lambda p: p  # noqa: E731
        if self.mesh is not None:  # pi_ref sharded and gathered for its forward like the policy
            params = sharding.shard_params(params, self.mcfg, self.mesh)
            ref_policy = lambda p: sharding.gather_params(p, self.mcfg, self.mesh)  # noqa: E731
        self.lcfg, self.base, self.base_on_server, self.init_adapter = None, None, False, None
        self.init_record = None  # --lora-init's folder and adapter hash: checkpoints record it, resume checks it
        if cfg.lora_rank or cfg.lora_init:
            self.lcfg, self.init_adapter = hf_io.lora_start(self.mcfg, cfg.lora_rank, cfg.lora_alpha,
                                                            cfg.lora_targets, cfg.lora_init)
            if self.init_adapter is not None:
                self.init_record = {"path": os.path.abspath(cfg.lora_init),
                                    "sha256": lora.fingerprint(self.init_adapter, self.lcfg)}
            self.base = params if self.mesh is not None else jax.tree_util.tree_map(jax.numpy.asarray, params)
            # --lora-init: its adapter merged as the workers merge (so version 0, full as every lineage's
            # version 0 is, is its policy bit for bit) is our base; a fresh adapter of the same config
            # trains on top, and final/adapter holds the two as one adapter for cfg.model (lora.concat)
            if self.init_adapter is not None:
                self.log(f"LoRA adapter from {cfg.lora_init} (sha256 {self.init_record['sha256']}), "
                         "merged into the base")
                self.base = lora.merge(self.base, self.init_adapter, self.mcfg, self.lcfg)
            adapter = lora.init_adapter(self.mcfg, self.lcfg, jax.random.key(cfg.seed))
            self.master, self.opt_state = update.init_lora_state(adapter, self.optimizer, self.mesh)
            self.ref_params = self.base if gcfg.kl_beta > 0 else None  # pi_ref: the cold-start policy
            self.log(f"LoRA rank {self.lcfg.rank} alpha {self.lcfg.alpha:g} on {','.join(self.lcfg.targets)}: "
                     f"{lora.param_count(self.mcfg, self.lcfg)} trained parameters of {model.param_count(self.mcfg)}")
        else:
            self.master, self.opt_state = update.init_state(params, self.mcfg, self.optimizer, self.mesh)
            self.ref_params = params if gcfg.kl_beta > 0 else None  # pi_ref: the cold-start policy
        self.update = update.make_update(self.mcfg, gcfg, self.optimizer, cfg.temperature, self.mesh,
                                         self.lcfg, self.base)
        self.ref_logprobs = jax.jit(lambda p, t: model.token_logprobs(ref_policy(p), self.mcfg, t, cfg.temperature))
        if self.mesh is not None:  # pi_ref's rows split over "data" (padded) like the update's
            ref_jit = self.ref_logprobs
            put = lambda tokens_RT: sharding.shard_rows({"tokens_RT": tokens_RT}, self.mesh)["tokens_RT"]  # noqa: E731
            self.ref_logprobs = lambda p, tokens_RT: multihost.to_host(ref_jit(p, put(tokens_RT)))[:len(tokens_RT)]

    def load_data(self) -> None:
        """The training problems and the held-out set, T and the microbatch. The cursor is the index
        of the next training problem; problem i is fixed by (seed, i)."""
        cfg = self.cfg
        if cfg.data:
            problems = tasks.load_jsonl(cfg.data, reward=bool(cfg.reward))
            self.math = any(p.kind == "math" for p in problems)
            self.train_set, self.heldout = tasks.split_dataset(problems, min(cfg.heldout, len(problems) // 2))
            order = np.random.default_rng(cfg.seed).permutation(len(self.train_set))
            source = lambda j: self.train_set[order[j % len(order)]]  # noqa: E731
            train_keys = {tasks.problem_key(p) for p in self.train_set}
        else:
            self.math = False
            stream = tasks.train_problems(cfg.seed)
            source, self.heldout = stream.__getitem__, tasks.heldout_problems(cfg.heldout)
            train_keys = stream.keys()
        # Problem i of the run: the source's order, less what curation passes over (tasks.TrainOrder)
        keep = tasks.read_keys(cfg.curated) if cfg.curated else None
        if keep is not None and not keep & train_keys:
            raise ValueError(f"--curated {cfg.curated}: none of its {len(keep)} keys is a training problem here")
        self.problem = tasks.TrainOrder(source, keep, cfg.skip_uniform, cfg.skip_prob, cfg.seed)
        # T, one for the run (the rows' length on the wire): from the data's longest prompt
        # (an episode of --max-turns turns: each turn's budget and, between turns, an observation)
        budget = cfg.max_new_tokens if not cfg.env else cfg.max_turns * cfg.max_new_tokens + \
            (cfg.max_turns - 1) * envs.OBSERVATION_TOKENS
        self.T = cfg.seq_len or (workitems.fit_seq_len([self.prompt_len(p) for p in problems], budget,
                                                       self.mcfg.max_seq_len) if cfg.data else self.mcfg.max_seq_len)
        if self.T > self.mcfg.max_seq_len:
            raise ValueError(f"seq_len {self.T} exceeds the model's max_seq_len {self.mcfg.max_seq_len}")
        fits = [p for p in self.heldout if workitems.fits(self.prompt_len(p), self.T, cfg.max_new_tokens)]
        if len(fits) < len(self.heldout):
            self.log(f"{len(self.heldout) - len(fits)} held-out problems left out: prompt + max_new_tokens "
                     f"exceeds seq_len {self.T}")
            self.heldout = fits
        self._rows_at = {}
        self.microbatch = self.rows_for(self.T)
        self.log(f"prompt format {self.fmt}; seq_len {self.T} (prompt + {cfg.max_new_tokens} new tokens); "
                 f"microbatch {self.microbatch} rows at that length, more for shorter rows (packing.py)")

    def layout(self, data: dict) -> tuple[list, np.ndarray, bool]:
        """The update's [minibatch][microbatch] layout of the batch, each row's place in it (order) and
        whether it is by length: rows grouped by real length, each microbatch cut to its bucket length
        (packing.pack_batch), when that saves at least --pack-min-saving of the positions; else every
        row at the run's T (split_batch: one shape, compiled once)."""
        packed, order = packing.pack_batch(data, self.cfg.minibatches, self.rows_for)
        positions = sum(mb["mask_RT"].size for mini in packed for mb in mini)
        if positions <= (1.0 - self.cfg.pack_min_saving) * data["mask_RT"].size:
            return packed, order, True
        return update.split_batch(data, self.cfg.minibatches, self.microbatch), np.arange(len(data["mask_RT"])), False

    def rows_for(self, T_b: int) -> int:
        """Rows per microbatch of bucket length T_b (packing.plan): --microbatch if given, else the most
        rows of T_b tokens that fit the memory budget (fit_microbatch), computed once per length."""
        if T_b not in self._rows_at:
            self._rows_at[T_b] = self.cfg.microbatch or update.fit_microbatch(
                self.mcfg, T_b, self.cfg.memory_budget_gb, self.mesh, with_ref=self.gcfg.kl_beta > 0, lcfg=self.lcfg)
        return self._rows_at[T_b]

    def resume(self, ledger_path: str) -> None:
        """--resume: the newest checkpoint's state and books, or, with none yet, the initial model."""
        if not checkpointing.list_checkpoints(self.cfg.run_dir):
            self.log("--resume: no checkpoint yet, starting from the initial model")
            # A run that died before its first checkpoint: its fates belong to steps we redo, with
            # the same prompts from cursor 0.
            self.ledger_lines = checkpointing.rewind_ledger(ledger_path, 0)
            return
        meta = self.collective("restore")
        # Step, cursor, counts; prompts without a fate at the checkpoint are sampled again with
        # our (restored) weights, enqueued by the first check_param_server.
        self.collector.restore(meta, wire.WorkItem.from_dict)
        if "train_order" in meta:
            self.problem.restore(meta["train_order"])
        self.t_start -= meta.get("time_s", 0.0)  # time_s continues across restarts
        # The ledger as it was at the checkpoint: later fates belong to steps we redo.
        self.ledger_lines = checkpointing.rewind_ledger(ledger_path, meta["ledger_lines"])
        self.log(f"resumed from step {self.step_n} (cursor {self.collector.cursor}, "
                 f"{len(self.books.in_flight)} prompts in flight)")

    # -- plumbing ---------------------------------------------------------------------------------
    @property
    def step_n(self) -> int:
        """Our policy version: the number of batches trained on (the collector counts them)."""
        return self.collector.version

    def item(self, problem: tasks.Problem, item_id: str, G: int, version: int, evaluate=False, temperature=None):
        return workitems.problem_item(problem, item_id, self.cfg, G, self.T, version, evaluate, self.lineage,
                                      temperature, self.fmt, self.template)

    def training_item(self, index: int, version: int) -> tuple:
        """Training problem `index` (of the data order) as a work item asking for weights >= version,
        and whether its prompt + max_new_tokens fit seq_len (lifecycle.Collector.feed)."""
        problem = self.problem(index)
        item = self.item(problem, f"train/{index}|{problem.item_id}", self.gcfg.group_size, version)
        return item, workitems.fits(len(self.tokenizer.encode(item.prompt)), self.T, self.cfg.max_new_tokens)

    def prompt_len(self, problem: tasks.Problem) -> int:
        return workitems.prompt_len(self.tokenizer, problem, self.fmt, self.template, self.cfg.env)

    def log(self, text: str) -> None:
        print(f"[trainer] {time.strftime('%H:%M:%S')} {text}", flush=True)

    # -- across hosts (multihost.py) ----------------------------------------------------------------
    # Everything that touches the sharded state is a command, run by every trainer process in the
    # leader's order: update, push, checkpoint, restore, export. With one process it is a plain call.
    def commands(self) -> dict:
        """What the leader may ask every trainer process to run (collective): a fixed table, so a
        follower runs only these, and a reader finds each one by name."""
        return {"update": self.do_update, "push": self.do_push, "checkpoint": self.do_checkpoint,
                "restore": self.do_restore, "export": self.do_export}

    def collective(self, command: str, payload=None):
        """The leader runs commands()[command](payload) on every trainer process, itself included."""
        return multihost.collective(self.commands(), command, payload)

    def follow(self) -> int:
        """A follower's life: the leader's commands until it says stop; returns the leader's exit status."""
        return multihost.follow(self.commands())

    def do_update(self, payload: dict):
        """Step 3's device work: pi_ref's log-probs when the KL term is on, then the update."""
        minibatches = payload["minibatches"]
        if self.ref_params is not None:
            for mb in (mb for minibatch in minibatches for mb in minibatch):
                mb["logp_ref_RT"] = self.ref_logprobs(self.ref_params, mb["tokens_RT"])
        self.master, self.opt_state, logp_RT, aux = self.update(self.master, self.opt_state, minibatches,
                                                                epochs=payload["epochs"])
        return logp_RT, aux

    def do_push(self, payload: dict) -> None:
        """Each tensor is cut from the (sharded) master and cast on the devices, then gathered to the host
        (hf_io.iter_hf_tensors). Beyond the master the host holds the tensor being sent and what the
        weights_zmq.PUSH_WINDOW chunks in flight refer to (views of the tensor before it, or small packed
        chunks). Followers take part in the gathers; the leader streams the tensors (weights_zmq.push_weights)."""
        if self.lcfg is not None and not payload.get("full"):  # an adapter version: the adapter alone, in
            # the compute dtype (rounded as lora.merge rounds it: the workers merge the trainer's policy)
            named = lora.adapter_tensors(jax.tree_util.tree_map(multihost.to_host, self.master), self.mcfg)
            if self.leader:  # its manifest names its base (version 0, our lineage's full one) and the merge
                weights_zmq.push_weights(self.ps, payload["version"], payload["lineage"], list(named.items()),
                                         base=0, lora=self.lcfg.to_dict())
            return
        tensors = hf_io.iter_hf_tensors(self.master if self.lcfg is None else self.base, self.mcfg,
                                        dtype=self.mcfg.jdtype)
        try:
            if self.leader:
                weights_zmq.push_weights(self.ps, payload["version"], payload["lineage"], tensors)
        finally:
            for _ in tensors:  # followers; and the leader after a failed push: every process gathers every tensor
                pass

    def do_checkpoint(self, payload: dict) -> str:
        """LoRA: the checkpoint holds the adapter and its Adam state (the base is the model folder's),
        the LoRA config and the --lora-init adapter's folder and sha256 (null without one), so a resume
        with other --lora-* flags or another init adapter is refused (checkpointing.check_lora_resume)."""
        lora_meta = {"lora": self.lcfg.to_dict(), "lora_init": self.init_record} if self.lcfg is not None else {}
        return checkpointing.save_checkpoint(self.cfg.run_dir, payload["step"], self.master, self.opt_state,
                                             {**payload["meta"], **lora_meta}, self.cfg.keep_checkpoints)

    def do_restore(self, _=None) -> dict:
        """The checkpoint's state, once its meta.json says its LoRA config and init adapter are this run's
        (checkpointing.check_lora_resume, before its tensors are read: else a ValueError naming both)."""
        ours, notes = self.lcfg.to_dict() if self.lcfg is not None else None, []
        check = lambda meta: notes.append(checkpointing.check_lora_resume(meta, ours, self.init_record))  # noqa: E731
        self.master, self.opt_state, meta = checkpointing.load_checkpoint(
            self.cfg.run_dir, self.master, self.opt_state, on_mesh=self.mesh is not None, check=check)
        for note in filter(None, notes):
            self.log(note)
        return meta

    def do_export(self, _=None) -> str:
        """The trained policy as a Hugging Face folder, $RUN_DIR/final (hf_io.save_final): the bf16 weights
        the workers sample with and the model folder's tokenizer files; hf_io.load_hf, `warmup.py --report`
        and transformers load it. LoRA: also final/adapter, a PEFT folder for cfg.model: the trained adapter,
        or with --lora-init the init adapter and the trained one as one adapter of rank 2r (lora.concat),
        which applied to cfg.model gives final/'s policy up to one rounding to the compute dtype."""
        policy = self.update.policy(self.master)
        policy = update.cast_params(policy, self.mcfg.jdtype) if self.lcfg is None else policy
        lcfg, adapter = self.lcfg, None
        if lcfg is not None:  # gathered on every process, as the policy's tensors are
            adapter = jax.tree_util.tree_map(multihost.to_host, self.master)
            if self.init_adapter is not None:  # --lora-init's adapter and ours, one adapter for cfg.model
                lcfg, adapter = lora.concat(self.init_adapter, adapter, self.lcfg)
        if not self.leader:  # the same gathers as save_hf's, nothing written
            hf_io.to_hf_tensors(policy, self.mcfg)
            return ""
        return hf_io.save_final(os.path.join(self.cfg.run_dir, "final"), self.mcfg, policy, self.cfg.model,
                                lcfg, adapter)

    def write_metrics(self, metrics: dict) -> None:
        metrics = {"step": self.step_n, "time_s": round(time.monotonic() - self.t_start, 3), **metrics,
                   **{f"rollouts/{k}": self.books.counts[k] for k in (*lifecycle.FATES, "duplicate")}}
        try:  # written by launch.sh's supervisor
            with open(os.path.join(self.cfg.run_dir, "restarts.json")) as f:
                metrics.update({f"restarts/{role}": n for role, n in json.load(f).items()})
        except (OSError, ValueError):
            pass
        self.metrics_file.write(json.dumps({k: (float(v) if isinstance(v, (np.floating, jax.Array)) else v)
                                            for k, v in metrics.items()}) + "\n")
        self.metrics_file.flush()
        for writer in self.writers:  # TensorBoard / W&B copies (--log-to)
            writer.write(self.step_n, metrics)

    def check_param_server(self) -> None:
        """A restarted param server (new instance id) lost its queue: give it our weights and every
        item whose rollout we do not hold. The trainer is the one owner of that state."""
        pong = self.ps.call(wire.Ping(), what="param server liveness")
        restarted = pong.instance != self.ps_instance
        # LoRA: our adapter versions apply to our version 0; a restarted server that kept it (its state
        # dir) says so, and only one without it gets the base again
        self.base_on_server = pong.info.get("lineage") == self.lineage and pong.info.get("base") == 0
        if restarted or pong.info.get("version") != self.step_n or pong.info.get("lineage") != self.lineage:
            if restarted and self.ps_instance is not None:
                self.log(f"param server restarted (instance {pong.instance}); re-sending weights and work")
            self.push()
        if restarted:
            items = self.collector.server_restarted()
            if items:
                self.ps.call(wire.EnqueueWork([i.to_dict() for i in items], requeue=True), what="re-enqueue")
            self.ps_instance = pong.instance

    def record(self, item_id: str, fate: str) -> None:
        """The ledger: one line per training prompt's final fate (lifecycle.FATES), tagged with the
        step it belongs to, so a checker can prove no prompt was lost or used twice."""
        step = self.step_n if fate == lifecycle.TRAINED else self.step_n + 1
        self.ledger.write(json.dumps({"step": step, "item_id": item_id, "fate": fate}) + "\n")
        self.ledger.flush()
        self.ledger_lines += 1

    def push(self) -> float:
        """Send the policy (the bf16 cast of the master) as version step_n, streamed (weights_zmq.push_weights):
        chunks of versions.CHUNK_BYTES, then the manifest; the param server swaps in a complete, checked set
        or nothing. Built one tensor at a time (do_push), whatever the model's size.
        LoRA: the base goes first, as the full version 0 of our lineage, whenever this param server lacks it
        (our first push; a restarted server without its state, check_param_server); every later version
        carries the adapter alone, naming version 0 as its base. The adapter starts at B = 0, which merges
        to the base exactly: the base IS version 0's policy."""
        t0 = time.monotonic()
        with self.timeline.span("push", step=self.step_n):
            if self.lcfg is not None and not self.base_on_server:
                self.collective("push", {"version": 0, "lineage": self.lineage, "full": True})
                self.base_on_server = True
                if self.step_n == 0:
                    return time.monotonic() - t0
            self.collective("push", {"version": self.step_n, "lineage": self.lineage})
        return time.monotonic() - t0

    def push_trained(self) -> float:
        """Step 4: push the version just trained. A param server that stalls or restarts during the
        push is the failure collection meets too, and is handled the same way: log it and
        check_param_server until the server holds this version (pushed again; a restarted server also
        gets our in-flight items again). The run keeps its lineage and every prompt in flight. A
        SIGTERM ends the retries: the checkpoint follows, and the resumed trainer pushes. Returns the
        seconds it took."""
        t0 = time.monotonic()
        try:
            self.push()
        except (TimeoutError, wire.RemoteError) as e:
            self.log(f"{type(e).__name__} while pushing version {self.step_n}: {e}; retrying")
            while not self.stop_requested:
                try:
                    self.check_param_server()
                    break
                except (TimeoutError, wire.RemoteError) as e:
                    self.log(f"{type(e).__name__}: {e}; retrying")
                    time.sleep(0.5)
        return time.monotonic() - t0

    def enqueue(self, items: list) -> None:
        if items:
            self.ps.call(wire.EnqueueWork([i.to_dict() for i in items]), what="enqueue receipt")

    def make_auditor(self) -> audit.Auditor:
        """Our checks of a worker's tokens (audit.py). Log-probs and draws need our policy on one device
        computing the sampler's bits (--bf16-fix, or a tolerance for int8 workers)."""
        cfg, template = self.cfg, prompts.load_chat_template(self.cfg.model)
        end_of_turn = prompts.end_of_turn_id(template, self.tokenizer) if template else None
        exact = self.mesh is None and cfg.audit_frac > 0 and (cfg.bf16_fix or cfg.audit_logp_tol > 0)
        if cfg.audit_frac > 0 and not exact:
            self.log("audit: log-probs and tokens not checked (a sharded trainer, or --no-bf16-fix without "
                     "--audit-logp-tol); every rollout's prompt and text still are")
        params = lambda: self.update.policy(self.master) if self.lcfg is not None else \
            update.policy_params(self.master, self.mcfg)  # noqa: E731
        return audit.Auditor(
            cfg.audit_frac, cfg.audit_logp_tol, self.tokenizer, self.mcfg, self.tokenizer.pad_id,
            eos_of=lambda stop: sampler.eos_for(self.tokenizer, stop, end_of_turn),
            logprobs=(lambda t: self.update.old_logprobs(self.master, [{"tokens_RT": t}])[0]) if exact else None,
            params=params if exact else None, rng=np.random.default_rng([cfg.seed, os.getpid()]))

    def parse_rollout(self, data):
        """A received rollout map as a Rollout, or None: malformed, or forged (audit.py; the param server
        refuses its worker and issues the item to another)."""
        try:
            rollout = wire.Rollout.from_dict(data)
        except wire.WireError as e:
            self.log(f"dropping malformed rollout: {e}")
            return None
        item = self.collector.books.in_flight.get(rollout.item_id) or self.collector.eval_pending.get(rollout.item_id)
        if item is None or rollout.lineage != self.lineage:
            return rollout  # a duplicate, or another trainer's: the books drop it
        if why := self.auditor.check(rollout, item, self.step_n):
            self.log(f"{rollout.item_id}: forged rollout of {rollout.worker}: {why}; dropped, the item goes to another")
            now = time.time()
            self.timeline.add("forged", now, now, item=rollout.item_id, worker=rollout.worker, why=why[:200])
            try:
                self.ps.call(wire.ForgedRollout(rollout.item_id, why), what="forged rollout receipt")
            except wire.RemoteError as e:
                self.log(f"the param server could not refuse its worker: {e}")
            return None
        return rollout

    def receive(self, wait_s: float) -> None:
        """Take finished rollouts (acknowledging the previous reply's); the collector hands the
        training ones to the books and keeps the evaluation ones. Counts the verifier's failures."""
        reply = self.ps.call(wire.GetRollouts(max_items=256, wait_s=wait_s, ack=self.collector.ack),
                             timeout_s=wait_s + 10, what="rollouts")
        self.queue_stats = reply.info  # the param server's counts (WorkQueue.stats): forged rollouts, refused workers
        for rollout in self.collector.receive(reply.rollouts, self.parse_rollout):
            failures = lifecycle.infra_failures(rollout.statuses)
            if not failures:
                self.problem.observe(rollout.item_id, rollout.rewards_G)  # --skip-uniform's streaks
            self.verifier_window.append((failures, len(rollout.statuses)))
            self.step_programs = [self.step_programs[0] + failures, self.step_programs[1] + len(rollout.statuses)]
            if failures:
                self.log(f"{rollout.item_id}: {lifecycle.verifier_failure_text(rollout.statuses)}: group dropped")
        lifecycle.check_verifier(self.verifier_window, self.cfg.max_verifier_failure_frac)  # VerifierBroken

    # -- the algorithm ----------------------------------------------------------------------------
    def collect_batch(self) -> float:
        """Steps 1-2: fill the books' batch with B usable groups (THE STALENESS BOUND is applied as
        each rollout enters it, lifecycle.Books.fill; DAPO dynamic sampling is grpo.keep_group). A
        param server hiccup (TimeoutError) or a SIGTERM loses nothing: the batch being assembled
        is still in flight in the books, and the next call continues it. Returns the time waited."""
        t0 = last_progress = time.monotonic()
        B = self.cfg.prompts_per_step
        keep = lambda rollout, seen: grpo.keep_group(rollout.rewards_G, seen, B, self.gcfg)
        while not self.collector.fill(keep):
            self.enqueue(self.collector.feed())  # step 1, each prompt tagged with our version (min_version)
            n = len(self.books.received) + len(self.books.batch)
            self.receive(wait_s=0.5)
            if len(self.books.received) + len(self.books.batch) != n:
                last_progress = time.monotonic()
            if time.monotonic() - last_progress > self.cfg.rollout_timeout_s:
                raise TimeoutError(f"no rollout for {self.cfg.rollout_timeout_s:.0f}s: are workers running "
                                   f"and connected to {self.cfg.param_server}?")
            if self.stop_requested:
                break
        return time.monotonic() - t0

    def train_step(self) -> dict:
        """Step 3: GRPO update on the books' batch of B groups; returns the step's metrics."""
        batch = self.collector.batch()  # THE STALENESS BOUND, asserted again
        version = self.step_n  # the version this batch is trained at
        tokens_RT = np.concatenate([r.tokens_GT for r in batch])
        logp_behav_RT = np.concatenate([r.logp_behav_GT for r in batch])
        mask_RT = sampled_RT = np.concatenate([r.mask_GT for r in batch])
        raw_BG = np.stack([r.rewards_G for r in batch])  # as the verifier gave them (before shaping)
        # A version per token (in-flight weight updates: a row's tokens may come from several versions)
        versions_RT = np.concatenate([r.token_versions() for r in batch])
        exact_RT = np.concatenate([lifecycle.exact_tokens(r.token_versions(), r.mask_GT, version, r.inflight)
                                   for r in batch])
        rewards_BG, keep_R = shaped_rewards(batch, self.gcfg)  # DAPO's overlong punishment and filter
        mask_RT = mask_RT * keep_R[:, None]
        adv_R = np.asarray(grpo.group_advantages(rewards_BG, self.gcfg)).reshape(-1)
        data = {"tokens_RT": tokens_RT, "adv_R": adv_R, "mask_RT": mask_RT, "logp_behav_RT": logp_behav_RT}
        t0 = time.monotonic()
        minibatches, order, packed = self.layout(data)  # [minibatch][microbatch]
        logp_RT, aux = self.collective("update", {"minibatches": minibatches, "epochs": self.cfg.ppo_epochs})
        logp_RT = packing.unpack(logp_RT, order, tokens_RT.shape)  # back to row order and length T
        train_s = time.monotonic() - t0
        self.collector.trained()  # step_n + 1; each prompt's fate: trained at it
        metrics = grpo.batch_metrics(aux, raw_BG, rewards_BG, adv_R, logp_behav_RT, mask_RT)
        metrics.update({**lifecycle.staleness_metrics(lifecycle.token_staleness(versions_RT, version), sampled_RT,
                                                      self.cfg.max_staleness),
                        "verifier/infra_error_frac": self.step_programs[0] / max(self.step_programs[1], 1),
                        # Liars (attest.py): rollouts whose rewards the verifier did not seal, and their workers
                        "rollouts/forged": int(self.queue_stats.get("forged", 0)),
                        "workers/refused": len(self.queue_stats.get("refused_workers", ())),
                        "rollouts/audited": self.auditor.counts["audited"],
                        **weight_metrics(self.queue_stats.get("weights", {})),
                        **{f"curation/passed_over_{k}": n for k, n in self.problem.passed_over.items()
                           if self.cfg.curated or self.cfg.skip_uniform},
                        "time/train_s": train_s, "len/padding_frac": packing.padding_frac(minibatches),
                        "len/packed": int(packed)})
        self.step_programs = [0, 0]
        metrics.update(envs.batch_metrics([r.env_stats for r in batch], [s for r in batch for s in r.statuses],
                                          self.math))
        # THE MEASUREMENT of the bf16 problem: the sampler's log-probs (as it reported them while
        # sampling) against ours inside the gradient computation, over the tokens our weights sampled
        # from inputs our weights computed (lifecycle.exact_tokens: same weights, same inputs).
        # How off-policy the stale tokens are (offpolicy/*): the same statistics between the policies that
        # sampled them and ours (policy drift over their staleness, plus any numerical mismatch).
        exact_RT &= mask_RT > 0
        metrics.update(grpo.mismatch_report(logp_behav_RT, logp_RT, exact_RT, (mask_RT > 0) & (versions_RT < version)))
        metrics.update(grpo.correction_metrics(logp_RT, logp_behav_RT, mask_RT, self.gcfg))  # logp_RT: pi_old
        if exact_RT.any():  # $RUN_DIR/mismatch.jsonl, one line per step
            with open(os.path.join(self.cfg.run_dir, "mismatch.jsonl"), "a") as f:
                line = {"step": self.step_n, **grpo.mismatch_histogram(logp_behav_RT, logp_RT, exact_RT)}
                f.write(json.dumps(line) + "\n")
        return metrics

    def evaluate(self) -> dict:
        """pass@1 and pass@8 on held-out problems, sampled by the workers at our current version; {} when
        a SIGTERM comes first (the checkpoint must not wait for the evaluation)."""
        with self.timeline.span("eval", step=self.step_n):
            return self._evaluate()

    def _evaluate(self) -> dict:
        t0, n = time.monotonic(), self.cfg.eval_samples
        # crn_key: the same random numbers at every evaluation of this run (sampler.row_keys),
        # so the change between two evaluations is the weights' doing, not the draw's
        step, heldout = self.step_n, list(enumerate(self.heldout))
        items = [dataclasses.replace(self.item(p, f"eval/{step}/{j}|{p.item_id}", n, step, evaluate=True),
                                     crn_key=f"seed{self.cfg.seed}/eval/{j}|{p.item_id}") for j, p in heldout]
        if self.cfg.eval_greedy:  # one greedy completion per problem: the mode of the policy
            items += [self.item(p, f"evalg/{step}/{j}|{p.item_id}", 1, step, evaluate=True, temperature=0.0)
                      for j, p in heldout]
        pending = self.collector.eval_pending
        pending.update({i.item_id: i for i in items})
        self.collector.evals = []
        self.enqueue(items)
        last_progress = time.monotonic()
        while pending and not self.stop_requested:
            try:
                n_before = len(self.collector.evals)
                self.receive(wait_s=0.5)
                if len(self.collector.evals) != n_before:
                    last_progress = time.monotonic()
            except (TimeoutError, wire.RemoteError) as e:  # param server restarting: re-send, go on
                self.log(f"{type(e).__name__} during evaluation: {e}; retrying")
                self.check_param_server()
                continue
            if time.monotonic() - last_progress > self.cfg.rollout_timeout_s:
                raise TimeoutError(f"evaluation stalled with {len(pending)} problems unanswered")
        if pending:  # SIGTERM: the checkpoint is due within launch.sh's grace; no numbers from half a set
            self.log(f"evaluation at step {step} abandoned for SIGTERM: {len(pending)} of {len(items)} unanswered")
            pending.clear()
            return {}
        # A problem whose programs the verifier failed on says nothing about the policy: left out.
        evals = self.collector.evals
        scored = [r for r in evals if not lifecycle.infra_failures(r.statuses)]
        solved = {kind: [int((r.rewards_G >= 1.0).sum()) for r in scored if r.item_id.startswith(kind)]
                  for kind in ("eval/", "evalg/")}
        return {**objectives.eval_metrics(solved["eval/"], n, solved["evalg/"]),
                "eval/verifier_failed": len(evals) - len(scored), "wait/eval_s": time.monotonic() - t0}

    def checkpoint(self) -> None:
        """Every prompt without a fate goes into the checkpoint (the batch being assembled and the
        rollouts in hand included), and the ledger's length: a resumed trainer cuts the ledger back
        to it and enqueues those prompts again, so each has exactly one fate in the end."""
        meta = {**self.collector.snapshot(), "seed": self.cfg.seed, "ledger_lines": self.ledger_lines,
                "time_s": time.monotonic() - self.t_start, "train_order": self.problem.state()}
        with self.timeline.span("checkpoint", step=self.step_n):
            path = self.collective("checkpoint", {"step": self.step_n, "meta": meta})
        self.log(f"checkpoint {path}")

    def export_policy(self) -> str:
        return self.collective("export")


EXIT_STOP_RUN = 3
"""The trainer's exit status for "do not restart me, stop the run" (launch.sh obeys it)."""

if __name__ == "__main__":
    config, grpo_config = cli.parse(Config, grpo.GRPOConfig)
    # Several trainer hosts: join them first (multihost.py), before anything touches a device.
    multihost.initialize(config.coordinator, config.num_processes, config.process_id)
    import devices  # the chips launch.sh placed us on, logged; stop rather than fall back to the CPU
    devices.check("trainer")
    try:
        trainer = Trainer(config, grpo_config)
    except (ValueError, FileNotFoundError, loggers.MissingPackage) as e:  # bad model, dataset, checkpoint, --log-to
        raise SystemExit(f"trainer: cannot start: {e}")
    if not trainer.leader:  # the leader decides when to stop (after a checkpoint all processes take part in)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(trainer.follow())
    # Preemption notice: finish the current step, checkpoint, exit (checked between steps).
    signal.signal(signal.SIGTERM, lambda *_: setattr(trainer, "stop_requested", True))
    status = 1
    try:
        trainer.run()
        status = 0
    except SystemExit as e:
        status = e.code
        raise
    except lifecycle.VerifierBroken as e:
        trainer.checkpoint()  # what was learned so far is kept; a RESUME=1 run continues after a fix
        trainer.log(f"stopping the run: {e}")
        status = EXIT_STOP_RUN
        raise SystemExit(EXIT_STOP_RUN)
    finally:
        multihost.release(status)  # the followers leave with our status
        for writer in trainer.writers:
            writer.close()
