"""update.py: the GRPO update on one batch, as pure jitted functions the trainer calls once a step.

    update = make_update(mcfg, gcfg, optimizer, temperature, mesh)     # built once per run
    master, opt_state = init_state(params, mcfg, optimizer, mesh)      # the f32 master and Adam's state
    master, opt_state, logp_RT, aux = update(master, opt_state, split_batch(data, minibatches, microbatch))

The trainer (trainer.py) owns the I/O around it: which rows make the batch (lifecycle.py), their
rewards and advantages (grpo.py), how rows are laid out into microbatches (packing.py), where the
weights go afterwards (weights.py). Here: the forward + backward of each microbatch on the trainer's
graph (model.token_logprobs, the sampler's function, so the bf16 fix holds: model.py PRECISION POLICY),
the loss of grpo.py, the summed gradients, one optax step per minibatch, and how many rows fit in
memory (fit_microbatch).

LoRA (lora.py; make_update(..., lcfg=, base=), init_lora_state): the master is the f32 adapter, the
base stays frozen in the compute dtype, Adam's state is the adapter's. Each optimizer step first
merges (lora.merge, the function the sampler installs with), then every microbatch's forward +
backward runs on those merged weights and its gradient is projected onto A and B
(lora_microbatch_grad).
"""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

import grpo
import lora
import memory
import model
import multihost
import objectives
import sharding


def cast_params(master, dtype):
    """f32 master weights -> the model dtype. Sampler and trainer both run exactly these bf16 values."""
    return jax.tree_util.tree_map(lambda x: x.astype(dtype), master)


def split_batch(data: dict, minibatches: int, microbatch: int) -> list[list[dict]]:
    """The rows of `data` (arrays, rows first, all of one length) as [minibatch][microbatch] dicts of row
    slices, in row order: `minibatches` contiguous minibatches, each cut into microbatches of at most
    `microbatch` rows. Equal minibatches when `minibatches` divides the rows (Config makes sure it does
    for the trainer's batch); otherwise the first (rows % minibatches) minibatches get one row more
    (as np.array_split). With minibatches=1: one minibatch, microbatches rows [0, m), [m, 2m), ..."""
    lengths = {k: len(v) for k, v in data.items()}
    n = next(iter(lengths.values()), 0)
    if any(v != n for v in lengths.values()):
        raise ValueError(f"split_batch: arrays of different row counts {lengths}")
    if not 1 <= minibatches <= n or microbatch < 1:
        raise ValueError(f"split_batch needs 1 <= minibatches <= rows and microbatch >= 1; got "
                         f"minibatches={minibatches}, rows={n}, microbatch={microbatch}")
    sizes = [n // minibatches + (j < n % minibatches) for j in range(minibatches)]
    bounds = [sum(sizes[:j]) for j in range(minibatches + 1)]
    return [[{k: v[i:min(i + microbatch, hi)] for k, v in data.items()} for i in range(lo, hi, microbatch)]
            for lo, hi in zip(bounds[:-1], bounds[1:])]


def policy_params(master, mcfg: model.ModelConfig, mesh=None):
    """The bf16 weights the forward runs on: the cast master, gathered over "data" on a mesh."""
    if mesh is None:
        return cast_params(master, mcfg.jdtype)
    return sharding.gather_params(cast_params(master, mcfg.jdtype), mcfg, mesh)


def microbatch_loss(master, mb: dict, weight, *, mcfg: model.ModelConfig, gcfg: grpo.GRPOConfig,
                    temperature: float, mesh=None):
    """One microbatch's share of the minibatch loss: (loss * weight, (logp_RT, aux * weight)).
    The log-probs (model.token_logprobs on policy_params), pi_old, then grpo.policy_loss.
    weight None (a rollout correction that rejects tokens, gcfg.rejects): the loss is weighted by the
    microbatch's own kept denominator, known only now, and aux is left unweighted for the caller
    (Update.minibatch_step) to weigh. aux also holds den_kept and den_rejected (grpo.policy_loss)."""
    logp_RT = model.token_logprobs(policy_params(master, mcfg, mesh), mcfg, mb["tokens_RT"], temperature)
    # pi_old: given (taken before the batch's first optimizer step), or, in that first step, the
    # current policy itself: then the ratio pi/pi_old is exactly 1 and only the behaviour
    # correction (pi_old/pi_behav) acts.
    logp_old_RT = mb["logp_old_RT"] if "logp_old_RT" in mb else jax.lax.stop_gradient(logp_RT)
    # Clip-Cov's draw: per token, from its row and position only, so packed and fixed layouts draw alike
    draw_RT = objectives.token_draws(mb["tokens_RT"], mb["mask_RT"]) if gcfg.cov_penalty == "clip_cov" else None
    loss, aux = grpo.policy_loss(logp_RT, logp_old_RT, mb["adv_R"], mb["mask_RT"], gcfg,
                                 logp_behav_RT=mb["logp_behav_RT"], logp_ref_RT=mb.get("logp_ref_RT"),
                                 draw_RT=draw_RT)
    counts = {k: aux.pop(k) for k in ("den_kept", "den_rejected")}
    aux = {k: v for k, v in aux.items() if not k.endswith("_RT") and k != "num_tokens"}
    if weight is None:
        return loss * jax.lax.stop_gradient(counts["den_kept"]), (logp_RT, {**aux, **counts})
    return loss * weight, (logp_RT, {**{k: v * weight for k, v in aux.items()}, **counts})


def lora_microbatch_grad(adapter, policy, mb: dict, weight, *, mcfg: model.ModelConfig, lcfg: lora.LoraConfig,
                         gcfg: grpo.GRPOConfig, temperature: float, mesh=None):
    """LoRA's microbatch_loss and gradient: the loss is microbatch_loss on `policy`, the merged weights
    (lora.merge, computed outside this graph by the function the sampler calls too, so the forward
    runs on the sampler's exact bits), differentiated with respect to the target projections of that
    policy and projected onto the adapter's A and B (lora.project_grads). Returns
    ((loss * weight, (logp_RT, aux * weight)), f32 gradient of the adapter)."""
    def loss(targets):
        params = {**policy, "layers": {**policy["layers"], **targets}}
        return microbatch_loss(params, mb, weight, mcfg=mcfg, gcfg=gcfg, temperature=temperature, mesh=mesh)
    out, g = jax.value_and_grad(loss, has_aux=True)({t: policy["layers"][t] for t in lcfg.targets})
    return out, lora.project_grads({"layers": g}, adapter, mcfg, lcfg)


def optimizer_step(master, opt_state, grads, optimizer):
    """One optax update of the f32 master from the summed gradients: (master, opt_state, grad norm)."""
    updates, opt_state = optimizer.update(grads, opt_state, master)
    return optax.apply_updates(master, updates), opt_state, optax.global_norm(grads)


def _check_update_args(minibatches: list, epochs) -> None:
    if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 1:
        raise ValueError(f"update: epochs must be an int >= 1; got {epochs!r}")
    if not minibatches or any(isinstance(mini, dict) or not mini for mini in minibatches):
        raise ValueError("update takes a non-empty list of minibatches, each a non-empty list of "
                         "microbatch dicts (see split_batch)")


class Update:
    """The GRPO (PPO-style) update on one batch of rollouts, built once per run (make_update):
        update(master, opt_state, minibatches, epochs=1) -> (master, opt_state, logp_RT, aux)

    minibatches: [minibatch][microbatch] dicts (`split_batch`) of tokens_RT, adv_R, mask_RT, logp_behav_RT
    and, with kl_beta > 0, logp_ref_RT (the trainer's batch keys). Each minibatch is
    one optimizer step (`minibatch_step`): every microbatch is one jitted forward + backward of
    `microbatch_loss` (the trainer's graph), the gradients are summed with grpo.microbatch_weight so that
    the step equals one on the whole minibatch, then one `optimizer_step`. `epochs` passes go over the
    minibatches in the given order (no shuffling): epochs x len(minibatches) optimizer steps, each moving
    Adam's state once.

    pi_old, the proximal policy the PPO ratio and clip are centred on, is the policy before the first
    optimizer step, for every row. For the first minibatch it is the stop-gradient of the log-probs of
    its own first forward + backward (the ratio is exactly 1 there, as with one step per batch); for
    the other minibatches it is one forward (model.token_logprobs on the same cast params) before the
    first step (`old_logprobs`). Later steps see ratios != 1, so clipping, clip-higher, dual clip and
    GSPO's clip act.

    Microbatches may differ in length (packing.pack_batch cuts each to its rows' bucket length).
    Returns logp_RT: those pre-update log-probs, every row in the given (row) order, zero-padded to the
    longest microbatch: the trainer's
    numbers at the weights that sampled the on-policy rows, which the mismatch metrics compare with
    the sampler's (bitwise at staleness 0 under model.py's precision policy). aux: grpo.policy_loss's
    scalars and "loss" (each a minibatch value) and grad_norm, averaged over the optimizer steps.

    Versions: the trainer pushes weights once per batch, so a policy version counts batches (weight
    pushes), however many optimizer steps each took. With epochs=1 and one minibatch (the defaults) a
    version is one optimizer step and the computation is exactly the one-step update (same graphs).

    mesh: None (one device: the unsharded program), or a sharding.make_mesh mesh. Then master and
    opt_state must be in sharding.param_shardings / opt_state_shardings (Trainer places them) and stay
    so: gradients are reduce-scattered to the master's layout, Adam updates each shard where it lives.
    The forward gathers the bf16 policy over "data" (sharding.gather_params), so every row is computed
    whole on one tensor group. Each microbatch is padded with empty rows (mask 0, advantage 0: no loss,
    no gradient) to a multiple of the data axis and split over it; their log-probs are dropped. (With
    loss_agg=seq_mean_token_sum_norm the empty rows count in the row share that weights each
    microbatch's clip and IS fractions, which then read up to padding/rows high; loss and gradient
    are exact, since aggregate's R * max_len counts the same rows.)
    Across hosts (multihost.py) every trainer process calls update with the same minibatches; the
    log-probs come back to every host (an all-gather), the state stays in its shards."""

    def __init__(self, mcfg: model.ModelConfig, gcfg: grpo.GRPOConfig, optimizer, temperature: float,
                 mesh=None, lcfg: lora.LoraConfig | None = None, base=None):
        self.gcfg, self.mesh, self.mcfg, self.lcfg, self.base = gcfg, mesh, mcfg, lcfg, base
        out = {}  # one device: jit's defaults; on a mesh the outputs stay in sharding.py's layouts
        if mesh is not None:
            params_sh, rep = sharding.param_shardings(mcfg, mesh), sharding.replicated(mesh)
            rows_sh = sharding.row_sharding(mesh)
            out = {"grad": ((rep, (rows_sh, rep)), params_sh), "logp": rows_sh, "add": params_sh,
                   "apply": (params_sh, sharding.opt_state_shardings(optimizer, mcfg, mesh), rep)}
            if lcfg is not None:  # the adapter, its gradient and Adam's state: replicated (small)
                out.update({"grad": ((rep, (rows_sh, rep)), rep), "add": rep, "apply": (rep, rep, rep)})
        jit = lambda fn, name: jax.jit(fn, **({"out_shardings": out[name]} if out else {}))  # noqa: E731
        if lcfg is None:
            loss = functools.partial(microbatch_loss, mcfg=mcfg, gcfg=gcfg, temperature=temperature, mesh=mesh)
            self.grad_fn = jit(jax.value_and_grad(loss, has_aux=True), "grad")
        else:  # grad_fn(adapter, merged policy, mb, weight)
            self.grad_fn = jit(functools.partial(lora_microbatch_grad, mcfg=mcfg, lcfg=lcfg, gcfg=gcfg,
                                                 temperature=temperature, mesh=mesh), "grad")
        self.logp_fn = jit(lambda master, tokens_RT: model.token_logprobs(
            policy_params(master, mcfg, mesh), mcfg, tokens_RT, temperature), "logp")
        self.add = jit(lambda a, b: jax.tree_util.tree_map(jnp.add, a, b), "add")
        self.scale = jit(lambda a, c: jax.tree_util.tree_map(lambda x: x * c, a), "add")
        self.apply = jit(functools.partial(optimizer_step, optimizer=optimizer), "apply")

    def policy(self, master):
        """What the forward runs on: the master itself (cast inside the graphs), or with LoRA the base
        merged with the adapter `master` (lora.merge, in the compute dtype: the sampler's weights)."""
        return master if self.lcfg is None else lora.merge(self.base, master, self.mcfg, self.lcfg)

    def grads(self, master, policy, mb: dict, weight):
        """One microbatch's ((loss, (logp_RT, aux)), gradient of the master) on the trainer's graph."""
        if self.lcfg is None:
            return self.grad_fn(master, mb, weight)
        return self.grad_fn(master, policy, mb, weight)

    def place(self, mb: dict) -> dict:
        """A microbatch as the jitted graphs take it: on a mesh padded and split over "data"."""
        return mb if self.mesh is None else sharding.shard_rows(mb, self.mesh)

    def old_logprobs(self, master, mini: list) -> list:
        """pi_old of one minibatch's rows at the starting weights, one array per microbatch."""
        policy = self.policy(master)
        return [multihost.to_host(self.logp_fn(policy, self.place({"tokens_RT": mb["tokens_RT"]})["tokens_RT"]))
                [:len(mb["tokens_RT"])] for mb in mini]

    def minibatch_step(self, master, opt_state, mini: list, logp_old: list | None, totals):
        """One optimizer step on one minibatch: the summed microbatch gradients, then optimizer_step.
        logp_old None: the batch's first step, whose own log-probs become pi_old (returned).
        A correction that rejects tokens (gcfg.rejects) knows each microbatch's kept denominator only
        after its forward: each loss is weighted by its own, and the sum divided by the minibatch's once
        (grpo.kept_denominator), so the step is still the one of the whole minibatch over its kept tokens."""
        grads, logps, aux, rejected = None, [], {}, 0.0
        policy = self.policy(master)
        for i, mb in enumerate(mini):
            if logp_old is not None:
                mb = {**mb, "logp_old_RT": logp_old[i]}
            n_rows, mb = len(mb["tokens_RT"]), self.place(mb)
            weight = None if self.gcfg.rejects else grpo.microbatch_weight(mb["mask_RT"], totals, self.gcfg)
            (loss, (logp_RT, mb_aux)), g = self.grads(master, policy, mb, weight)
            grads = g if grads is None else self.add(grads, g)
            if logp_old is None:
                logps.append(multihost.to_host(logp_RT)[:n_rows])
            kept, rejected = float(mb_aux.pop("den_kept")), rejected + float(mb_aux.pop("den_rejected"))
            if weight is None:  # the loss terms are sums to divide once below; the fractions weigh by the mask
                share = grpo.microbatch_weight(mb["mask_RT"], totals, self.gcfg)
                mb_aux = {k: v * (kept if k in grpo.LOSS_TERMS else share) for k, v in mb_aux.items()}
            mb_aux["loss"] = loss
            aux = {k: aux.get(k, 0.0) + float(v) for k, v in mb_aux.items()}
        if self.gcfg.rejects:
            scale = 1.0 / max(float(grpo.kept_denominator(totals, rejected, self.gcfg)), 1.0)
            grads = self.scale(grads, jnp.float32(scale))
            aux = {k: v * scale if k in grpo.LOSS_TERMS + ("loss",) else v for k, v in aux.items()}
        master, opt_state, grad_norm = self.apply(master, opt_state, grads)
        return master, opt_state, logp_old if logp_old is not None else logps, aux, float(grad_norm)

    def __call__(self, master, opt_state, minibatches: list, epochs: int = 1):
        _check_update_args(minibatches, epochs)
        # each minibatch's loss denominators, summed over its microbatches (which may differ in length)
        totals = [tuple(map(sum, zip(*(grpo.loss_totals(mb["mask_RT"]) for mb in mini)))) for mini in minibatches]
        # pi_old of every row, at the starting weights: minibatch 0's comes from its first step
        logp_old = [None] + [self.old_logprobs(master, mini) for mini in minibatches[1:]]
        aux, grad_norms = {}, []
        for _ in range(epochs):
            for j, mini in enumerate(minibatches):
                master, opt_state, logp_old[j], step_aux, grad_norm = self.minibatch_step(
                    master, opt_state, mini, logp_old[j], totals[j])
                grad_norms.append(grad_norm)
                aux = {k: aux.get(k, 0.0) + v for k, v in step_aux.items()}
        n_steps = len(grad_norms)
        aux = {k: v / n_steps for k, v in aux.items()}
        logps = [x for mini in logp_old for x in mini]  # microbatches of packing.pack_batch differ in T
        width = max(x.shape[1] for x in logps)
        logp_RT = np.concatenate([np.pad(x, ((0, 0), (0, width - x.shape[1]))) for x in logps])
        return master, opt_state, logp_RT, {**aux, "grad_norm": sum(grad_norms) / n_steps}


def make_update(mcfg: model.ModelConfig, gcfg: grpo.GRPOConfig, optimizer, temperature: float, mesh=None,
                lcfg: lora.LoraConfig | None = None, base=None):
    """The update for this model, loss and optimizer (see Update): its graphs are jitted once. With
    lcfg (LoRA) the master is the f32 adapter and `base` the frozen weights in the compute dtype."""
    return Update(mcfg, gcfg, optimizer, temperature, mesh, lcfg, base)


def init_state(params: dict, mcfg: model.ModelConfig, optimizer, mesh=None):
    """(f32 master, optimizer state) from the model's weights. On a mesh both are made in their
    shards (sharding.param_shardings / opt_state_shardings): the f32 master and Adam's moments never
    exist whole on one device; params may be host numpy (hf_io.load_hf(host=True)) or sharded."""
    if mesh is None:
        master = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params)
        return master, optimizer.init(master)
    master = jax.jit(lambda p: cast_params(p, jnp.float32), out_shardings=sharding.param_shardings(mcfg, mesh))(
        sharding.shard_params(params, mcfg, mesh))
    return master, jax.jit(optimizer.init, out_shardings=sharding.opt_state_shardings(optimizer, mcfg, mesh))(master)


def init_lora_state(adapter: dict, optimizer, mesh=None):
    """(f32 adapter, optimizer state) of a LoRA run: both small, replicated on a mesh."""
    adapter = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), adapter)
    if mesh is None:
        return adapter, optimizer.init(adapter)
    rep = sharding.replicated(mesh)
    adapter = jax.device_put(adapter, rep)
    return adapter, jax.jit(optimizer.init, out_shardings=rep)(adapter)


MICROBATCH_MAX = 128


def memory_budget_bytes(gb: float) -> int:
    """Bytes per trainer device: `gb` if given, else 80% of the device's own limit, else (the CPU, which
    reports none) half of the machine's RAM."""
    if gb > 0:
        return int(gb * 2**30)
    stats = jax.devices()[0].memory_stats() or {}
    if stats.get("bytes_limit"):
        return int(0.8 * stats["bytes_limit"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def fit_microbatch(mcfg: model.ModelConfig, T: int, budget_gb: float, mesh=None, with_ref: bool = False,
                   lcfg: lora.LoraConfig | None = None) -> int:
    """The most rows per microbatch whose forward+backward (memory.train_step_bytes) fits beside the
    trainer's state (memory.train_state_bytes; with lcfg, LoRA's) in the memory budget of each device,
    at most MICROBATCH_MAX. On a mesh the state is split over every device (FSDP) and the rows over
    "data". Raises if not one row fits."""
    n, data = (1, 1) if mesh is None else (mesh.size, mesh.shape["data"])
    state = memory.train_state_bytes(mcfg, lcfg, n) + (2 * model.param_count(mcfg) if with_ref else 0)
    budget = memory_budget_bytes(budget_gb)
    rows = memory.rows_for_budget(mcfg, T, budget, state_bytes=state)
    if rows == 0:
        raise ValueError(f"one row of {T} tokens does not fit {budget / 2**30:.1f} GiB per device beside the "
                         f"trainer's state ({state / 2**30:.1f} GiB); use more trainer chips, a shorter "
                         f"--seq-len/--max-new-tokens or a larger --memory-budget-gb")
    return min(MICROBATCH_MAX, rows * data)
