"""An inference worker: lease prompts, sample a group of completions each, get them verified, return rollouts.

    python inference_worker.py --param-server tcp://127.0.0.1:5555 --verifier tcp://127.0.0.1:5557 \
        --model checkpoints/coldstart --name worker-0

Sockets (all requests, see wire.py):
  -> param server   hello (once), get_weights (pull), lease_work, renew_leases (from a heartbeat
                    thread with a socket of its own), submit_rollout
  -> verifier       verify_batch

The loop, one batch at a time:
  1. Pull. Every `pull_every` batches ask the param server for weights newer than ours (a cheap
     question when nothing changed). Independently of that, a work item carries `min_version` = the
     trainer's version when it enqueued it: we never sample an item with older weights than that,
     waiting for them if needed (lifecycle.worker_action: sample, wait, or abandon an item whose
     trainer is gone). Together with the trainer's check when a rollout enters a batch this is the
     staleness bound: `max_staleness` decides how far ahead of itself the trainer enqueues, and so
     how stale a rollout can get by the time it is used.
  2. Lease up to `batch_items` items and sample G completions for each in ONE decode batch,
     padded to a fixed row count so the jitted sampler compiles once. All tokens of a batch come
     from one weight version: weights are only swapped between batches. Leases are short
     (`lease_s`); the heartbeat renews them every lease_s / 3 until the rollouts are submitted.
  3. Cut each completion at its stop string, send prompt + completion with the item's hidden tests
     to the verifier, and submit one rollout per item: tokens, the log-probs the sampler sampled
     with (the trainer compares its own to these, bit for bit, at staleness 0), mask, rewards,
     verdict statuses, and the policy version. A verifier that does not answer (after one retry)
     gives every program the status lifecycle.INFRA_ERROR: the trainer then drops the group and
     counts it, instead of reading a broken sandbox as a policy that fails.

A worker keeps no state worth saving: SIGKILL it at any time. Its heartbeats stop, so its leases
lapse within lease_s, and its restarted successor's hello releases them at once (invariant 3).
Sampling settings (temperature, top_p, stop, lengths) come with each work item from the trainer, so
sampler and trainer cannot disagree on them.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
import zlib
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

import cli
import hf_io
import lifecycle
import model
import sharding
import wire


@dataclass
class Config:
    """Inference worker settings."""
    param_server: str = "tcp://127.0.0.1:5555"
    """address of the parameter server"""
    verifier: str = "tcp://127.0.0.1:5557"
    """address of the verifier service"""
    model: str = "checkpoints/coldstart"
    """checkpoint folder whose config.json (and tokenizer) we use; weights come from the param server"""
    name: str = ""
    """worker name in logs and rollouts (default: worker-<pid>)"""
    batch_items: int = 2
    """work items sampled together: the decode batch is batch_items x G rows"""
    pull_every: int = 1
    """check for newer weights every this many batches (items' min_version is always honoured)"""
    lease_s: float = 10.0
    """lease length, renewed every lease_s / 3 while we sample: if we die, our items are reissued
    after at most this long (at once when our restarted successor says hello)"""
    bf16_fix: bool = True
    """precision policy / RLAX fix on; must match the trainer's (launch.sh passes both the same)"""
    seed: int = 0
    """base sampling seed; each batch's key also folds in the item ids and the weight version"""
    slow_s: float = 0.0
    """testing knob: sleep this long after sampling each batch, to make a deliberately slow worker"""
    max_batches: int = 0
    """stop after this many batches (0: run until killed)"""
    timeout_s: float = 20.0
    """how long to wait for any one reply of the param server before reconnecting and retrying"""
    verify_timeout_s: float = 120.0
    """how long to wait for the verifier's verdicts on one batch (twice, then lifecycle.INFRA_ERROR)"""
    tensor_parallel: int = 1
    """devices to shard the model over (sharding.py, "tensor" axis: heads, MLP width, vocab), for a model
    that does not fit one device; the worker uses its first tensor_parallel visible devices. 1: one
    device, the unsharded sampler. A split matmul sums in another order, so the log-probs we report are
    no longer bitwise the trainer's (its mismatch/* metrics; sharding.py has the measurements)"""

    def __post_init__(self):
        if self.batch_items < 1 or self.pull_every < 1 or not 0 < self.lease_s <= 3600 or self.slow_s < 0:
            raise ValueError("batch_items and pull_every must be >= 1, lease_s in (0, 3600], slow_s >= 0")
        if self.tensor_parallel < 1:
            raise ValueError(f"tensor_parallel must be >= 1, got {self.tensor_parallel}")
        if not self.verifier:
            raise ValueError("--verifier: the address of the verifier service is required")
        self.name = self.name or f"worker-{os.getpid()}"


def log(cfg: Config, text: str) -> None:
    print(f"[{cfg.name}] {time.strftime('%H:%M:%S')} {text}", flush=True)


# ----------------------------------------------------------------------------- sampling (pure)

def settings(item: wire.WorkItem) -> tuple:
    """What one generate() call needs to be the same for all its rows."""
    return item.seq_len, item.max_new_tokens, item.temperature, item.top_p, tuple(item.stop)


def build_prompts(items: list, tokenizer, rows: int, pad_id: int):
    """Each item's prompt repeated G times, right-padded to the item's seq_len, then dummy rows up to
    `rows` (a fixed decode batch: one compilation). Returns (prompt_BT, prompt_len_B)."""
    T = items[0].seq_len
    prompt_BT = np.full((rows, T), pad_id, np.int32)
    prompt_len_B = np.ones(rows, np.int32)
    r = 0
    for item in items:
        ids = tokenizer.encode(item.prompt)
        if not 0 < len(ids) <= T - item.max_new_tokens:
            raise ValueError(f"item {item.item_id}: prompt of {len(ids)} tokens does not fit "
                             f"seq_len {T} with max_new_tokens {item.max_new_tokens}")
        for _ in range(item.group_size):
            prompt_BT[r, :len(ids)], prompt_len_B[r] = ids, len(ids)
            r += 1
    return prompt_BT, prompt_len_B


def cut_completions(out: dict, prompt_len_B, tokenizer, stop: tuple, pad_id: int):
    """Cut every completion just after its first stop string: later tokens become padding with mask 0,
    so the trainer learns only from what the verifier saw. Returns (out, texts)."""
    tokens_BT, logp_BT, mask_BT = out["tokens_BT"].copy(), out["logp_BT"].copy(), out["mask_BT"].copy()
    texts = []
    for b in range(tokens_BT.shape[0]):
        start, n = int(prompt_len_B[b]), int(mask_BT[b].sum())
        ids, keep = tokens_BT[b, start:start + n].tolist(), n
        for j in range(1, n + 1):  # the shortest prefix that contains a stop string
            if any(s and s in tokenizer.decode(ids[:j]) for s in stop):
                keep = j
                break
        texts.append(tokenizer.decode(ids[:keep]))
        tokens_BT[b, start + keep:], logp_BT[b, start + keep:], mask_BT[b, start + keep:] = pad_id, 0.0, 0.0
    return {"tokens_BT": tokens_BT, "logp_BT": logp_BT, "mask_BT": mask_BT}, texts


def row_keys(seed: int, items: list, version: int, rows: int):
    """One sampling key per decode row (the layout of build_prompts), for model.generate.

    A training item's G rows draw from its item id and the weight version: a rerun samples the same.
    An item with a "crn_key" (the trainer's evaluation items) draws from that key and the row's index
    alone, not from the version, from this worker's seed or from the items it shares a lease with. So
    every evaluation of a run uses the same random numbers whichever worker samples it (common random
    numbers): the difference between two evaluations measures the change of weights, not the luck of
    the draw, and each one is still an unbiased estimate. (The trainer puts its own seed in crn_key.)
    """
    base = jax.random.PRNGKey(seed)
    keys = []
    for item in items:
        if item.crn_key:
            item_key = jax.random.fold_in(jax.random.PRNGKey(0), zlib.crc32(item.crn_key.encode()))
        else:
            item_key = jax.random.fold_in(base, zlib.crc32(f"{item.item_id}@{version}".encode()))
        keys.append(jax.vmap(jax.random.fold_in, (None, 0))(item_key, jnp.arange(item.group_size)))
    n = sum(len(k) for k in keys)
    keys.append(jax.random.split(jax.random.fold_in(base, version), rows - n))  # dummy rows
    return jnp.concatenate(keys)


def verify_jobs(items: list, texts: list) -> list:
    jobs, r = [], 0
    for item in items:
        for _ in range(item.group_size):
            program = item.prompt + texts[r]
            if item.kind == "io":
                jobs.append({"kind": "io", "program": program, "cases": item.cases, "timeout_s": item.timeout_s})
            else:  # tasks.Problem.tests is self-contained (HumanEval's ends with check(entry_point))
                jobs.append({"kind": "assert", "program": program, "tests": item.tests,
                             "timeout_s": item.timeout_s})
            r += 1
    return jobs


def tensor_mesh(tensor_parallel: int, devices=None):
    """The worker's mesh: 1 x tensor_parallel over its first tensor_parallel visible devices (None for 1:
    the unsharded sampler on the default device). One worker is one data-parallel replica; more
    replicas are more workers (launch.sh gives each its chips)."""
    if tensor_parallel == 1:
        return None
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) < tensor_parallel:
        raise ValueError(f"--tensor-parallel {tensor_parallel} needs that many devices; {len(devices)} visible")
    return sharding.make_mesh(data=1, tensor=tensor_parallel, devices=devices[:tensor_parallel])


# ----------------------------------------------------------------------------- the worker

class Heartbeat:
    """Renews the leases this worker holds every lease_s / 3, from a thread of its own with a socket
    of its own (ZeroMQ sockets are not thread-safe), while the main thread samples and verifies."""

    def __init__(self, cfg: Config, incarnation: str):
        self.cfg, self.incarnation = cfg, incarnation
        self.leases: dict[str, str] = {}
        self.lock = threading.Lock()
        self.client = wire.Client(cfg.name + "-heartbeat", cfg.param_server, timeout_s=cfg.lease_s / 3)
        threading.Thread(target=self.run, daemon=True).start()

    def hold(self, items: list) -> None:
        with self.lock:
            self.leases.update({i.item_id: i.lease for i in items})

    def drop(self, items: list) -> None:
        with self.lock:
            for i in items:
                self.leases.pop(i.item_id, None)

    def run(self) -> None:
        while True:
            time.sleep(self.cfg.lease_s / 3)
            with self.lock:
                pairs = [[k, v] for k, v in self.leases.items()]
            if pairs:
                try:
                    self.client.call(wire.RenewLeases(self.cfg.name, pairs, self.cfg.lease_s, self.incarnation),
                                     what="lease renewal")
                except (TimeoutError, wire.RemoteError) as e:  # the server restarting: try again soon
                    log(self.cfg, f"lease renewal failed: {e}")


class Worker:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        with open(os.path.join(cfg.model, "config.json")) as f:
            self.mcfg = model.ModelConfig.from_hf_dict(json.load(f), bf16_fix=cfg.bf16_fix)
        self.tokenizer = hf_io.load_tokenizer(cfg.model)
        self.pad_id = self.tokenizer.pad_id
        self.mesh = tensor_mesh(cfg.tensor_parallel)  # None: one device
        self.incarnation = os.urandom(4).hex()  # this process: a restart is a new incarnation
        self.ps = wire.Client(cfg.name, cfg.param_server, timeout_s=cfg.timeout_s)
        self.verifier = wire.Client(cfg.name, cfg.verifier, timeout_s=cfg.verify_timeout_s)
        self.heartbeat = Heartbeat(cfg, self.incarnation)
        self.version, self.lineage, self.params, self.batches = -1, "", None, 0

    def install(self, w: wire.Weights) -> None:
        """Swap in a complete, checksummed weight version (invariant 4: never a partial one). With
        --tensor-parallel each tensor goes from the host straight to its shards."""
        for name, array, checksum in zip(w.names, w.arrays, w.checksums):
            if wire.crc32(array) != checksum:
                raise ValueError(f"weights v{w.version}: checksum mismatch on {name}; keeping v{self.version}")
        if self.mesh is None:
            self.params = jax.device_put(hf_io.from_hf_tensors(dict(zip(w.names, w.arrays)), self.mcfg))
        else:
            self.params = sharding.shard_params(hf_io.from_hf_tensors(dict(zip(w.names, w.arrays)), self.mcfg,
                                                                      host=True), self.mcfg, self.mesh)
        self.version, self.lineage = w.version, w.lineage

    def pull(self, min_version: int = 0, wait_s: float = 0.0) -> None:
        t0 = time.monotonic()
        reply = self.ps.call(wire.GetWeights(self.version, min_version, wait_s, self.lineage),
                             timeout_s=wait_s + self.cfg.timeout_s, what="weights")
        if isinstance(reply, wire.Weights):
            try:
                self.install(reply)
                log(self.cfg, f"weights v{reply.version} in {time.monotonic() - t0:.2f}s")
            except ValueError as e:
                log(self.cfg, str(e))

    def verify(self, jobs: list) -> list:
        """Verdict dicts {passed, reward, status, detail, fraction}, one per job. A verifier that does
        not answer twice (the second time on a fresh connection, which finds a restarted service)
        is an infrastructure failure: every job gets lifecycle.INFRA_ERROR, never a silent 0."""
        for attempt in (1, 2):
            try:
                return self.verifier.call(wire.VerifyBatch(jobs=jobs), what=f"{len(jobs)} verdicts").verdicts
            except (TimeoutError, wire.RemoteError) as e:
                log(self.cfg, f"verifier attempt {attempt} failed: {e}")
                error = f"{type(e).__name__}: {e}"
        return [{"passed": False, "reward": 0.0, "status": lifecycle.INFRA_ERROR, "detail": error[:500],
                 "fraction": 0.0} for _ in jobs]

    def run_batch(self) -> int:
        cfg = self.cfg
        if self.params is None or self.batches % cfg.pull_every == 0:
            self.pull()
        leased = self.ps.call(wire.LeaseWork(cfg.name, cfg.batch_items, cfg.lease_s, wait_s=1.0,
                                             incarnation=self.incarnation),
                              timeout_s=cfg.timeout_s + 1, what="work items").items
        items = []
        for data in leased:
            try:
                items.append(wire.WorkItem.from_dict(data))
            except wire.WireError as e:
                log(cfg, f"skipping malformed work item: {e}")
        self.heartbeat.hold(items)
        try:
            # One generate() call needs one seq_len and one set of sampling settings: a lease that
            # mixes them (sampled and greedy evaluation items, say) is sampled group by group.
            groups = {}
            for item in items:
                groups.setdefault((settings(item), item.lineage), []).append(item)
            return sum(self.sample_and_submit(group) for group in groups.values())
        finally:
            self.heartbeat.drop(items)

    def wait_for_weights(self, items: list) -> str:
        """lifecycle.worker_action for a group of one lineage: pull until we may sample or must abandon."""
        need, lineage, newest = max(i.min_version for i in items), items[0].lineage, False
        while (action := lifecycle.worker_action(need, lineage, self.version, self.lineage, newest)) == lifecycle.WAIT:
            self.pull(min_version=need, wait_s=10.0)
            newest = True
        return action

    def sample_and_submit(self, items: list) -> int:
        cfg, first = self.cfg, items[0]
        if self.wait_for_weights(items) == lifecycle.ABANDON:
            log(cfg, f"abandoning {len(items)} items of trainer lineage {first.lineage!r}: the param server "
                     f"now serves lineage {self.lineage!r} (that trainer restarted and enqueues its own)")
            return 0
        seq_len, max_new, temperature, top_p, stop = settings(first)
        rows = cfg.batch_items * max(i.group_size for i in items)
        prompt_BT, prompt_len_B = build_prompts(items, self.tokenizer, rows, self.pad_id)
        stop_ids = [self.tokenizer.encode(s) for s in stop]
        eos = stop_ids[0][0] if len(stop) == 1 and len(stop_ids[0]) == 1 else self.tokenizer.eos_id

        t0 = time.monotonic()
        version = self.version
        out = model.generate(self.params, self.mcfg, prompt_BT, prompt_len_B,
                             row_keys(cfg.seed, items, version, rows),
                             max_new_tokens=max_new, temperature=temperature, top_p=top_p,
                             eos_id=eos, pad_id=self.pad_id)
        out, texts = cut_completions(out, prompt_len_B, self.tokenizer, stop, self.pad_id)
        sample_s = time.monotonic() - t0
        if cfg.slow_s:
            time.sleep(cfg.slow_s)
        t1 = time.monotonic()
        verdicts = self.verify(verify_jobs(items, texts))
        verify_s = time.monotonic() - t1

        r = 0
        for item in items:
            rows_G = slice(r, r + item.group_size)
            rollout = wire.Rollout(
                item_id=item.item_id, version=version, lineage=self.lineage, worker=cfg.name,
                prompt_len=int(prompt_len_B[r]),
                tokens_GT=out["tokens_BT"][rows_G].astype(np.int32),
                logp_GT=out["logp_BT"][rows_G].astype(np.float32),
                mask_GT=out["mask_BT"][rows_G].astype(np.float32),
                rewards_G=np.array([float(v["reward"]) for v in verdicts[rows_G]], np.float32),
                finished_G=np.array([any(s in t for s in stop) for t in texts[rows_G]]),
                statuses=[str(v["status"]) for v in verdicts[rows_G]],
                texts=texts[rows_G], eval=item.eval, sample_s=sample_s, verify_s=verify_s)
            status = self.ps.call(wire.SubmitRollout(cfg.name, item.item_id, item.lease, rollout.to_dict()),
                                  what="rollout receipt").info.get("status")
            if status != "accepted":
                log(cfg, f"rollout {item.item_id} was {status}")
            r += item.group_size
        n_tokens = int(out["mask_BT"].sum())
        infra = lifecycle.infra_failures([v["status"] for v in verdicts])
        log(cfg, f"v{version}: {len(items)} items, {n_tokens} tokens in {sample_s:.2f}s "
                 f"({n_tokens / max(sample_s, 1e-9):.0f} tok/s), verified in {verify_s:.2f}s, "
                 f"reward {np.mean([v['reward'] for v in verdicts]):.2f}"
                 + (f", {infra} verifier failures" if infra else ""))
        return len(items)

    def hello(self) -> None:
        """Tell the param server we (re)started: a predecessor of ours' leases go back to work now."""
        while True:
            try:
                released = self.ps.call(wire.Hello(self.cfg.name, self.incarnation), what="hello").info["released"]
                if released:
                    log(self.cfg, f"released {released} leases of a previous {self.cfg.name}")
                return
            except (TimeoutError, wire.RemoteError) as e:
                log(self.cfg, f"hello: {e}; retrying")
                time.sleep(0.5)

    def run(self) -> None:
        log(self.cfg, f"started: param server {self.cfg.param_server}, verifier {self.cfg.verifier}")
        self.hello()
        while not self.cfg.max_batches or self.batches < self.cfg.max_batches:
            try:
                if self.run_batch():
                    self.batches += 1
            except (TimeoutError, wire.RemoteError) as e:
                # The param server restarted or is busy: leases we stop renewing lapse and their
                # items are reissued; just try again. Never crash on a peer's hiccup.
                log(self.cfg, f"{type(e).__name__}: {e}; retrying")
                time.sleep(0.5)


if __name__ == "__main__":
    config = cli.parse(Config)
    import devices  # the chips launch.sh placed us on, logged; stop rather than fall back to the CPU
    devices.check(config.name)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # preemption: leases expire, work is reissued
    try:
        worker = Worker(config)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"{config.name}: cannot start: {e}")
    worker.run()
