"""An inference worker: lease prompts, sample a group of completions each, get them verified, return rollouts.

    python inference_worker.py --param-server tcp://127.0.0.1:5555 --verifier tcp://127.0.0.1:5557 \
        --model checkpoints/coldstart --name worker-0

Sockets (all requests, see wire.py):
  -> param server   hello (once), lease_work, renew_leases (from a heartbeat thread with a socket of
                    its own), submit_rollout; get_weights and get_chunk from the weight-fetching
                    thread (weights_zmq.WeightFetcher, its own sockets)
  -> other workers  get_chunk (relay mode: from our parent in the relay tree, or one step up)
  <- other workers  get_chunk, served by our weights_zmq.ChunkServer (relay mode; its own thread and socket)
  -> verifiers      verify_batch (and ping, while a batch is out), spread over every verifier named

The loop, one batch at a time:
  1. Pull. A thread of ours (weights_zmq.WeightFetcher, made by weight_fetcher; weights.py tells a
     version's whole way here; with --weights-dir a shared directory instead, weights_fs.py) fetches every new version in the background as a manifest and
     chunks, each CRC-checked, from the param server or, in relay mode (the default), from another
     worker the param server names, while it serves the chunks it holds on to the workers below it
     (the server sends each version about once, whatever the fleet size). Every `pull_every`
     batches we swap in the newest version it holds complete (a cheap look when nothing changed); a
     partial version is never used. A LoRA trainer's versions after its base carry the adapter alone:
     the worker keeps the base on its device (fetched once per lineage) and installs each as
     lora.merge(base, adapter), the trainer's own function (Worker.policy_params). Independently of
     that, a work item carries `min_version` = the trainer's version when it enqueued it: we never
     sample an item with older weights than that,
     waiting for them if needed (lifecycle.worker_action: sample, wait, or abandon an item whose
     trainer is gone). Together with the trainer's check when a rollout enters a batch this is the
     staleness bound: `max_staleness` decides how far ahead of itself the trainer enqueues, and so
     how stale a rollout can get by the time it is used.
  2. Lease up to `batch_items` items and sample G completions for each in ONE decode batch
     (sampler.py: generate, the rows laid out by build_prompts and keyed by row_keys), padded to a
     fixed row count so the jitted sampler compiles once (or over --slots decode slots, continuous.py). All tokens of a batch come from one weight version: weights are only swapped
     between batches. Leases are short (`lease_s`); the heartbeat renews them every lease_s / 3
     until the rollouts are submitted.
     With --inflight keep|recompute (run_inflight) there are no batches: rows stream through the
     decode slots, each new version is swapped in between decode steps without dropping the rows in
     progress (their KV cache kept, or recomputed under the new weights), items are leased as slots
     free up and submitted as soon as their G rows end, and each token records the version that
     sampled it (lifecycle.py: a rollout's version is its oldest token's).
     Items of a multi-turn task (env: a name in envs.ENVS, envs.run_episodes) are sampled turn by turn:
     between turns the environment answers (python_tool runs the model's code block in the sandbox,
     fix_tests its program against the tests) and its answer is appended as the next user message
     (tokenized once, mask 0) before the next turn; the last turn is verified.
  3. Cut each completion at its stop string, build its program (prompts.assemble_program: prompt +
     completion for base models, the fenced code of the answer for chat models), send it with the
     item's hidden tests to the verifier, and submit one rollout per item (Worker.finish, the one
     place a sampler.Samples record of any sampling path becomes rollouts): tokens, the log-probs the sampler sampled
     with (the trainer compares its own to these, bit for bit, at staleness 0), mask, rewards,
     verdict statuses, and the policy version. A verifier that does not answer (no pong, or no verdicts
     by the bound it gave for the batch; after one retry) gives every program the status INFRA_ERROR:
     the trainer then drops the group and counts it, instead of reading a broken sandbox as a policy
     that fails. With several verifiers (--verifier a,b,...) batches go round robin over them; one
     that stops answering is skipped for verifier_cooldown_s and its batch goes to the next;
     infra_error only when every one failed (verifier_client.VerifierFleet).

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
import traceback
from dataclasses import dataclass

import jax
import numpy as np

import attest
import cli
import continuous
import envs
import hf_io
import lifecycle
import lora
import model
import prompts
import quant
import sampler
import sharding
import timeline
import verifier_client
import versions
import weights
import weights_fs
import weights_zmq
import wire
from sampler import Samples, build_prompts, cut_completions, eos_for, row_budgets, row_keys, settings
from verdicts import INFRA_ERROR


@dataclass
class Config:
    """Inference worker settings."""
    param_server: str = "tcp://127.0.0.1:5555"
    """address of the parameter server"""
    verifier: str = "tcp://127.0.0.1:5557"
    """address of the verifier service, or several comma-separated (a fleet: batches go round robin
    over them, a dead one is skipped)"""
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
    slots: int = 0
    """continuous batching (continuous.generate_continuous): a batch's rows share this many decode rows
    (>= 16), a row that ends hands its slot to the next row, so a long completion no longer keeps the
    others' slots idle; worth it with more rows than slots (--batch-items x G). 0 = one generate() call,
    every row decoded until the batch's longest ends. The same tokens and log-probs either way"""
    inflight: str = "off"
    """in-flight weight updates (lifecycle.INFLIGHT_MODES): "keep" or "recompute" stream rows through
    continuous batching (--slots, 16 if 0) and swap in each new weight version between decode steps
    without dropping the rows in progress, keeping their KV cache or recomputing it under the new
    weights (continuous.Slots.swap); each token records the version that sampled it. "off": a batch's
    rows are sampled with one version, weights swapped between batches"""
    inflight_steps: int = 4
    """--inflight: decode steps per device call, i.e. how often we look for new weights and lease work.
    A swap can only land between calls: with calls as long as a whole completion, no row would ever
    see one (measured: 16 steps on 16-token completions, 0 of 110 swaps landed mid-row; 4 steps, 1 in 3)"""
    dtype: str = "bfloat16"
    """what the model computes in (hf_io.compute_dtype_override): bfloat16, float32 or checkpoint; must
    match the trainer's --dtype (launch.sh passes both DTYPE)"""
    seed: int = 0
    """base sampling seed; each batch's key also folds in the item ids and the weight version"""
    slow_s: float = 0.0
    """testing knob: sleep this long after sampling each batch, to make a deliberately slow worker"""
    token_delay_s: float = 0.0
    """benchmark knob: sleep this long per decode step, a sampler whose time goes to per-token latency (a
    long decode on a big model) rather than to this machine's cores (bench/bench_async.py --latency-bound)"""
    length_tail: float = 0.0
    """benchmark knob (needs --slots or --inflight): each row's token budget drawn from a long tail,
    max_new_tokens x min(1, 0.1 / (1 - u)^(1 / length_tail)), u uniform per item and row: with 1.0,
    half the rows get at most a fifth of the budget and one in ten all of it. 0: max_new_tokens"""
    max_batches: int = 0
    """stop after this many batches (0: run until killed)"""
    timeout_s: float = 20.0
    """how long to wait for any one reply of the param server before reconnecting and retrying"""
    verify_timeout_s: float = 120.0
    """the least time a batch's verdicts are waited for. The deadline is the verifier's own bound for the
    batch, sent with every pong (its jobs' limits and the work queued ahead of them), so a slow program
    gets its own timeout verdict and never makes its batch an infra failure; this is the floor under it,
    and how long a verifier tried a second time (a fleet of one) may take to answer its first ping
    (launch.sh restarting it). A batch not answered in time goes to the next verifier, then INFRA_ERROR"""
    verifier_ping_s: float = 2.0
    """ping the verifier holding a batch every this many seconds: one that does not answer a ping within
    2 x this is taken for dead at once (no deadline wait)"""
    verifier_cooldown_s: float = 30.0
    """a verifier that failed is skipped for this long (tried again only when every other one failed)"""
    relay: bool = True
    """weights by relay broadcast: fetch each version's chunks from the worker the param server names
    as our parent and serve them on to our own children (weights_zmq.RelayTree), so the server sends
    each version about once; --no-relay: fetch every chunk from the param server"""
    relay_bind: str = "tcp://127.0.0.1:*"
    """where our chunk server listens in relay mode (port *: any free one); its address is what the
    param server hands our children, so use a host they can reach (not 0.0.0.0; not loopback needs CURVE)"""
    relay_timeout_s: float = 3.0
    """how long a relay may take to produce a chunk before we fetch it one step up the tree"""
    fetch_delay_s: float = 0.0
    """testing knob: sleep this long after fetching each chunk (a slow link), to catch a relay mid-version"""
    weights_dir: str = ""
    """read each weight version from this shared directory (weights_fs.DirTransport), where the param
    server started with the same --weights-dir publishes them, instead of fetching chunks over the
    network (no relay): for a remote worker that shares a filesystem, not a fast path, with the server.
    "" = fetch from the param server"""
    timeline: str = ""
    """append one JSON line per span of work (pull, sample, verify, submit) to this file (timeline.py);
    "" = none. launch.sh gives $RUN_DIR/timeline/<name>.jsonl"""
    tensor_parallel: int = 1
    """devices to shard the model over (sharding.py, "tensor" axis: heads, MLP width, vocab), for a model
    that does not fit one device; the worker uses its first tensor_parallel visible devices. 1: one
    device, the unsharded sampler. A split matmul sums in another order, so the log-probs we report are
    no longer bitwise the trainer's (its mismatch/* metrics; sharding.py has the measurements)"""
    sampler_quant: str = "none"
    """sample with quantised weights (quant.py, QuaRL's 8-bit actors): "int8" quantises each version we
    install, weight-only, per output channel, symmetric (the layers' projections; embedding and head stay
    bf16); "fp8" the same in float8 e4m3, only on a GPU that has it (quant_unsupported). The trainer is
    unchanged, so its mismatch/* metrics measure the quantisation. "none": the weights as pushed"""

    def __post_init__(self):
        if self.sampler_quant not in quant.MODES:
            raise ValueError(f"--sampler-quant must be one of {quant.MODES}, got {self.sampler_quant!r}")
        if self.sampler_quant != "none" and self.tensor_parallel != 1:
            raise ValueError(f"--sampler-quant {self.sampler_quant} needs --tensor-parallel 1 "
                             f"(the sharding rules do not know quantised weights)")
        hf_io.compute_dtype_override(self.dtype)  # raises on an unknown one
        if self.slots and self.slots < model.MIN_DECODE_ROWS:
            raise ValueError(f"slots must be 0 (off) or >= {model.MIN_DECODE_ROWS}, got {self.slots}")
        if self.batch_items < 1 or self.pull_every < 1 or not 0 < self.lease_s <= 3600 or self.slow_s < 0:
            raise ValueError("batch_items and pull_every must be >= 1, lease_s in (0, 3600], slow_s >= 0")
        if not 0 < self.relay_timeout_s <= 600 or self.fetch_delay_s < 0:
            raise ValueError("relay_timeout_s must be in (0, 600], fetch_delay_s >= 0")
        if self.tensor_parallel < 1:
            raise ValueError(f"tensor_parallel must be >= 1, got {self.tensor_parallel}")
        if not self.verifier or not all(a.strip() for a in self.verifier.split(",")):
            raise ValueError("--verifier: the address of the verifier service (or several, comma-separated) "
                             "is required")
        if self.verifier_ping_s <= 0 or self.verifier_cooldown_s < 0:
            raise ValueError("verifier_ping_s must be > 0, verifier_cooldown_s >= 0")
        if self.inflight not in lifecycle.INFLIGHT_MODES or self.inflight_steps < 1:
            raise ValueError(f"--inflight must be one of {lifecycle.INFLIGHT_MODES} and --inflight-steps >= 1")
        if self.inflight != lifecycle.OFF:
            self.slots = self.slots or model.MIN_DECODE_ROWS
        if self.token_delay_s < 0 or self.length_tail < 0 or (self.length_tail and not self.slots):
            raise ValueError("token_delay_s and length_tail must be >= 0; length_tail needs --slots or --inflight")
        self.name = self.name or f"worker-{os.getpid()}"


def log(cfg: Config, text: str) -> None:
    print(f"[{cfg.name}] {time.strftime('%H:%M:%S')} {text}", flush=True)


def verifier_fleet(cfg: Config) -> verifier_client.VerifierFleet:
    """The worker's verifier client (verifier_client.VerifierFleet) with this worker's addresses, timeouts and log."""
    return verifier_client.VerifierFleet(cfg.name, [a.strip() for a in cfg.verifier.split(",")],
                                         timeout_s=cfg.verify_timeout_s, ping_s=cfg.verifier_ping_s,
                                         cooldown_s=cfg.verifier_cooldown_s, log=lambda text: log(cfg, text))


def weight_fetcher(cfg: Config, incarnation: str) -> weights.Transport:
    """The worker's weight transport (weights.py) with this worker's settings: with --weights-dir the
    shared directory's (weights_fs.DirTransport, read when asked); else the param server's chunks
    (weights_zmq.WeightFetcher, and its ChunkServer in relay mode), fetching from now on in a thread
    of its own."""
    if cfg.weights_dir:
        return weights_fs.DirTransport(cfg.weights_dir, log=lambda text: log(cfg, text))
    return weights_zmq.WeightFetcher(cfg.name, cfg.param_server, incarnation, log=lambda text: log(cfg, text),
                                     timeout_s=cfg.timeout_s, relay_bind=cfg.relay_bind if cfg.relay else None,
                                     relay_timeout_s=cfg.relay_timeout_s, fetch_delay_s=cfg.fetch_delay_s)


# ----------------------------------------------------------------------------- devices

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


def quant_unsupported(mode: str, device=None) -> str:
    """Why this worker's device cannot sample with --sampler-quant `mode`, or "" when it can. int8 runs
    anywhere (converted to bf16 inside the matmul); fp8 (e4m3) is accepted only on an NVIDIA GPU of
    compute capability >= 8.9 (Ada, Hopper and later: the first with e4m3 in hardware)."""
    if mode != "fp8":
        return ""
    device = device or jax.devices()[0]
    capability = str(getattr(device, "compute_capability", "") or "0")
    if device.platform == "gpu" and tuple(map(int, capability.split(".")[:2])) >= (8, 9):
        return ""
    return (f"--sampler-quant fp8 (e4m3) needs an NVIDIA GPU of compute capability >= 8.9 (Ada, Hopper or "
            f"newer); this worker runs on {device.platform}"
            + (f" (compute capability {capability})" if device.platform == "gpu" else "")
            + "; use --sampler-quant int8")


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
    WAIT_S = 10.0  # how long one pull of wait_for_weights waits for the weights a leased item needs

    def __init__(self, cfg: Config):
        self.cfg = cfg
        with open(os.path.join(cfg.model, "config.json")) as f:
            self.mcfg = hf_io.config_from_hf(json.load(f), bf16_fix=cfg.bf16_fix,
                                             **hf_io.compute_dtype_override(cfg.dtype))
        self.tokenizer = hf_io.load_tokenizer(cfg.model)
        self.pad_id = self.tokenizer.pad_id
        self.template = prompts.load_chat_template(cfg.model)  # multi-turn items render observations with it
        # the token that closes an assistant turn (a chat row stops there; a tool call may follow it)
        self.end_of_turn = prompts.end_of_turn_id(self.template, self.tokenizer) if self.template else None
        self.mesh = tensor_mesh(cfg.tensor_parallel)  # None: one device
        self.incarnation = os.urandom(4).hex()  # this process: a restart is a new incarnation
        self.ps = wire.Client(cfg.name, cfg.param_server, timeout_s=cfg.timeout_s)
        self.verifiers = verifier_fleet(cfg)
        self.heartbeat = Heartbeat(cfg, self.incarnation)
        self.timeline = timeline.Timeline(cfg.timeline, cfg.name)  # what we did when (timeline.py)
        self.version, self.lineage, self.params, self.batches = -1, "", None, 0
        # the full version adapter versions apply to (LoRA), kept on the device once per lineage
        self.base_key, self.base_params = None, None
        self.fetcher = weight_fetcher(cfg, self.incarnation)

    def install(self, v: versions.VersionBuffer) -> None:
        """Swap in a complete, checksummed weight version, its tensors {HF name: array} (invariant 4:
        never a partial one; the weight transport checked every CRC). An adapter version (LoRA)
        holds the adapter's tensors and its base (policy_params merges them onto the base)."""
        self.params = self.policy_params(v)
        if self.cfg.sampler_quant != "none":  # last: what we sample with is what was pushed, quantised
            before = quant.params_bytes(self.params)
            self.params = quant.quantise_params(self.params, self.cfg.sampler_quant)
            if self.version < 0:
                held = quant.params_bytes(self.params) + (quant.params_bytes(self.base_params) if self.base_params else 0)
                log(self.cfg, f"sampling with {self.cfg.sampler_quant} weights (quant.py): "
                              f"{quant.params_bytes(self.params) / 2**20:.2f} MiB, {before / 2**20:.2f} MiB as pushed; "
                              f"weights on the device {held / 2**20:.2f} MiB"
                              + (" (with the full-precision LoRA base)" if self.base_params else ""))
        self.version, self.lineage = v.key

    def to_device(self, tensors: dict) -> dict:
        """A full version {HF name: array} as the model's params on our device(s). With
        --tensor-parallel each tensor goes from the host straight to its shards."""
        if self.mesh is None:
            return jax.device_put(hf_io.from_hf_tensors(tensors, self.mcfg))
        return sharding.shard_params(hf_io.from_hf_tensors(tensors, self.mcfg, host=True), self.mcfg, self.mesh)

    def policy_params(self, v: versions.VersionBuffer) -> dict:
        """The policy in the compute dtype, before any quantisation. A full version goes to the device
        and is also the base that later adapter versions of its lineage apply to. An adapter version's
        policy is lora.merge(base on device, adapter): the jitted function the trainer runs its forward
        on, so both hold bit-identical weights. The base goes to the device first if we do not hold it
        (a new worker, a new lineage): once per lineage; afterwards a version costs its adapter's bytes
        and the merge. The LoRA config is the manifest's, so a worker cannot disagree with its trainer.
        A quantising worker (--sampler-quant) keeps a full-precision base only once an adapter version
        needs it: after a full version it holds the quantised weights alone."""
        if not v.is_adapter:
            params = self.to_device(v.tensors())
            if self.cfg.sampler_quant == "none":  # the policy itself: holding it as the base costs nothing
                self.base_key, self.base_params = v.key, params
            else:  # quantised next: a full-precision base beside it would cost more than int8 saves; an
                self.base_key, self.base_params = None, None  # adapter version brings the base back (LoRA)
            return params
        m = v.manifest
        lcfg = lora.LoraConfig.from_dict(m.lora)
        merge_in = lora.adapter_from_tensors(v.tensors(), self.mcfg, lcfg)
        if self.base_key != m.base_key:
            base = v.base
            if base is None or base.key != m.base_key or base.stream is None:
                raise ValueError(f"adapter v{m.version} applies to base v{m.base}, which this worker lacks")
            self.base_params = self.to_device(base.tensors())
            self.base_key = base.key
            self.fetcher.done(base)
            log(self.cfg, f"base weights v{base.key.version} of lineage {base.key.lineage!r} on the device")
        return lora.merge(self.base_params, merge_in, self.mcfg, lcfg)

    def pull(self, min_version: int = 0, wait_s: float = 0.0) -> None:
        """Swap in the newest version the weight transport holds complete (weights.Transport.newest), if it
        is new to us, waiting up to wait_s for one of at least min_version (or of another trainer lineage)."""
        t0, start = time.monotonic(), time.time()
        buf = self.fetcher.newest(max(min_version, self.version + 1), self.lineage, wait_s)
        if buf is None:
            if wait_s > 0:
                self.timeline.add("pull", start, time.time(), version=self.version)
            return
        try:
            self.install(buf)
            log(self.cfg, f"weights v{self.version} in {time.monotonic() - t0:.2f}s")
        except ValueError as e:
            log(self.cfg, f"weights v{buf.key.version} refused: {e}; keeping v{self.version}")
        finally:
            self.fetcher.done(buf)
            # what travelled for it: the whole version, or a delta from the one before (deltas.py)
            self.timeline.add("pull", start, time.time(), version=self.version, bytes=buf.fetched_bytes,
                              delta_from=buf.delta.base if buf.delta is not None else -1)

    def lease(self, wait_s: float) -> list:
        """Lease up to batch_items work items (their leases renewed by the heartbeat from now on)."""
        cfg = self.cfg
        leased = self.ps.call(wire.LeaseWork(cfg.name, cfg.batch_items, cfg.lease_s, wait_s=wait_s,
                                             incarnation=self.incarnation),
                              timeout_s=cfg.timeout_s + wait_s, what="work items").items
        items = []
        for data in leased:
            try:
                items.append(wire.WorkItem.from_dict(data))
            except wire.WireError as e:
                log(cfg, f"skipping malformed work item: {e}")
        self.heartbeat.hold(items)
        return items

    def run_batch(self) -> int:
        cfg = self.cfg
        if self.params is None or self.batches % cfg.pull_every == 0:
            self.pull()
        items = self.lease(wait_s=1.0)
        try:
            # One generate() call needs one seq_len and one set of sampling settings: a lease that
            # mixes them (sampled and greedy evaluation items, say) is sampled group by group.
            groups = {}
            for item in items:
                groups.setdefault((settings(item), item.lineage), []).append(item)
            return sum(self.sample_or_report(group) for group in groups.values())
        finally:
            self.heartbeat.drop(items)

    def sample_or_report(self, items: list) -> int:
        """sample_and_submit, except that an error no peer caused (a prompt this tokenizer or template
        cannot handle, a bug) is reported for these items alone (report_failed) and the worker goes on:
        leasing the same item again would fail the same way, forever."""
        try:
            return self.sample_and_submit(items)
        except (TimeoutError, wire.RemoteError, wire.WireError):
            raise  # a peer's hiccup: the caller retries, the lease lapses and the item is reissued
        except Exception as e:  # noqa: BLE001 (any error of ours: report it, never crash-loop on it)
            log(self.cfg, f"cannot sample {[i.item_id for i in items]}: {type(e).__name__}: {e}\n"
                          f"{traceback.format_exc(limit=4)}")
            self.report_failed(items, f"{type(e).__name__}: {e}")
            return len(items)

    def report_failed(self, items: list, error: str) -> None:
        """Submit each item as a group with no sampled token whose every verdict is infra_error (the
        error as its text): the trainer gives it the fate verifier_failed, never trains on it, and
        counts it with the verifier's failures (a run where most items fail this way stops, with the
        reason in this log, rather than looping)."""
        for item in items:
            G, T = item.group_size, item.seq_len
            tokens = np.full((G, T), self.pad_id, np.int32)
            tokens[:, 0] = self.tokenizer.bos_id if self.tokenizer.bos_id is not None else self.pad_id
            rollout = wire.Rollout(
                item_id=item.item_id, version=max(self.version, item.min_version, 0), lineage=self.lineage or item.lineage,
                worker=self.cfg.name, prompt_len=1, tokens_GT=tokens, logp_behav_GT=np.zeros((G, T), np.float32),
                mask_GT=np.zeros((G, T), np.float32), rewards_G=np.zeros(G, np.float32),
                finished_G=np.zeros(G, bool), statuses=[INFRA_ERROR] * G,
                texts=[f"[worker error] {error}"[:2000]] * G, eval=item.eval)
            try:
                self.ps.call(wire.SubmitRollout(self.cfg.name, item.item_id, item.lease, rollout.to_dict()),
                             what="rollout receipt")
            except (TimeoutError, wire.RemoteError, wire.WireError) as e:
                log(self.cfg, f"could not report {item.item_id}: {e} (its lease will lapse)")

    def wait_for_weights(self, items: list) -> str:
        """lifecycle.worker_action for a group of one lineage: pull until we may sample or must abandon.
        Our weights count as the newest only when the param server, asked after the pull, says so
        (holds_newest): a pull that brought nothing (the server down, restarting, slow) says nothing
        about the server, so an item of a trainer newer than our weights waits instead of being
        abandoned."""
        need, lineage, newest = max(i.min_version for i in items), items[0].lineage, False
        while (action := lifecycle.worker_action(need, lineage, self.version, self.lineage, newest)) == lifecycle.WAIT:
            self.pull(min_version=need, wait_s=self.WAIT_S)
            newest = self.holds_newest()
        return action

    def holds_newest(self) -> bool:
        """Ask the param server now: are the weights we hold (version, lineage) its newest? False when
        it does not answer. (GetWeights naming ours: WeightsUnchanged if they are its newest, else the
        manifest of its newest, which the fetcher is getting or will get.)"""
        if self.version < 0:
            return False
        try:
            reply = self.ps.call(wire.GetWeights(have_version=self.version, min_version=0, wait_s=0.0,
                                                 have_lineage=self.lineage, worker=self.cfg.name),
                                 what="the newest weight version")
        except (TimeoutError, wire.RemoteError, wire.WireError) as e:
            log(self.cfg, f"newest weights unknown: {e}")
            return False
        return isinstance(reply, wire.WeightsUnchanged) and (reply.version, reply.lineage) == (self.version, self.lineage)

    def eos_for(self, stop: tuple) -> tuple:
        return eos_for(self.tokenizer, stop, self.end_of_turn)

    def sample_and_submit(self, items: list) -> int:
        """Sample the items' G rows each with the weights we hold (one version), then finish them."""
        cfg, first = self.cfg, items[0]
        if self.wait_for_weights(items) == lifecycle.ABANDON:
            log(cfg, f"abandoning {len(items)} items of trainer lineage {first.lineage!r}: the param server "
                     f"now serves lineage {self.lineage!r} (that trainer restarted and enqueues its own)")
            return 0
        if first.env:
            return self.sample_episodes(items)
        seq_len, max_new, temperature, top_p, stop = settings(first)
        rows = cfg.batch_items * max(i.group_size for i in items)
        prompt_RT, prompt_len_R = build_prompts(items, self.tokenizer, rows, self.pad_id)
        eos = self.eos_for(stop)
        t0 = time.monotonic()
        version = self.version
        with self.timeline.span("sample", version=version, rows=rows) as span:
            keys = row_keys(cfg.seed, items, version, rows)
            if cfg.slots:  # continuous batching over the items' rows (no dummy rows needed)
                n = sum(i.group_size for i in items)
                out = continuous.generate_continuous(
                    self.params, self.mcfg, [prompt_RT[b, :prompt_len_R[b]] for b in range(n)], keys[:n],
                    cache_len=seq_len, max_new_tokens=sum((row_budgets(i, cfg.length_tail) for i in items), []),
                    slots=cfg.slots, temperature=temperature, top_p=top_p, eos_id=eos, pad_id=self.pad_id,
                    version=version)
                span["slot_util"] = round(out.stats["slot_util"], 4)
                steps = out.stats["decode_steps"]
            else:
                out = sampler.generate(self.params, self.mcfg, prompt_RT, prompt_len_R, keys,
                                       max_new_tokens=max_new, temperature=temperature, top_p=top_p,
                                       eos_id=eos, pad_id=self.pad_id, version=version)
                steps = int(out.completion_len_R.max())
            if cfg.token_delay_s:
                time.sleep(steps * cfg.token_delay_s)
            span["tokens"] = int(out.mask_RT.sum())
        return self.finish(items, out, time.monotonic() - t0)

    def sample_episodes(self, items: list) -> int:
        """Multi-turn items (item.env, a name in envs.ENVS; envs.run_episodes): each row's turns sampled
        with the weights we hold; between turns the env's step answers (running what it asks of the
        verifier fleet) and its answer is appended as the next user message, tokenized once (mask 0);
        the last turn is scored once (finish)."""
        cfg, first = self.cfg, items[0]
        end_of_turn = prompts.check_multi_turn(self.template, self.tokenizer)  # the trainer checked it at start
        seq_len, max_new, temperature, top_p, stop = settings(first)
        eos = self.eos_for(stop)
        end_text = self.tokenizer.special_text(end_of_turn)
        rows = [np.asarray(self.tokenizer.encode(i.prompt), np.int32) for i in items for _ in range(i.group_size)]
        keys = row_keys(cfg.seed, items, self.version, len(rows))

        def sample_turn(index, seqs, budgets, turn):  # row r's turn t draws from fold_in(key_r, t)
            turn_keys = jax.vmap(jax.random.fold_in, (0, None))(keys[np.asarray(index)], turn)
            res = continuous.generate_continuous(
                self.params, self.mcfg, seqs, turn_keys, cache_len=seq_len, max_new_tokens=budgets,
                slots=max(cfg.slots, model.MIN_DECODE_ROWS), temperature=temperature, top_p=top_p, eos_id=eos,
                pad_id=self.pad_id)
            return [res.completion(r) for r in range(len(seqs))]

        observe = lambda text: self.tokenizer.encode(prompts.next_turn_text(self.template, text, end_text))
        t0, version = time.monotonic(), self.version
        with self.timeline.span("sample", version=version, rows=len(rows)) as span:
            episodes = envs.run_episodes(envs.get(first.env), [r.tolist() for r in rows],
                                         items=[i for i in items for _ in range(i.group_size)],
                                         max_turns=first.max_turns, seq_len=seq_len, max_new_tokens=max_new,
                                         sample_turn=sample_turn, verify=self.verifiers.verify, observe=observe,
                                         decode=self.tokenizer.decode, eos_id=end_of_turn, stop_ids=eos)
            span["tokens"] = int(sum(sum(e.mask) for e in episodes))
        out = {"tokens_RT": np.full((len(rows), seq_len), self.pad_id, np.int32),
               "logp_behav_RT": np.zeros((len(rows), seq_len), np.float32), "mask_RT": np.zeros((len(rows), seq_len), np.float32)}
        for b, e in enumerate(episodes):
            n = min(len(e.tokens), seq_len)
            out["tokens_RT"][b, :n], out["logp_behav_RT"][b, :n], out["mask_RT"][b, :n] = e.tokens[:n], e.logp[:n], e.mask[:n]
        env_stats = [{"turns": [e.turns], "tool_calls": [e.tool_calls]} for e in episodes]
        samples = Samples.one_version(out["tokens_RT"], out["logp_behav_RT"], out["mask_RT"],
                                      np.array([r.size for r in rows]), version, [e.finished for e in episodes])
        return self.finish(items, samples, time.monotonic() - t0, texts=[e.final_text for e in episodes],
                           finished=[e.finished for e in episodes], env_stats=env_stats)

    def finish(self, items: list, samples: Samples, sample_s: float, texts=None, finished=None,
               env_stats=None) -> int:
        """The one place sampled rows (sampler.Samples, whichever path sampled them) become rollouts:
        cut each completion at its stop string, verify every program, submit one rollout per item.
        A rollout carries per-token versions only when its batch had several (in-flight updates);
        otherwise its one version. texts/finished given (multi-turn episodes): the completions are not
        cut, those texts are scored; env_stats: per row counts."""
        cfg = self.cfg
        stop = settings(items[0])[4]
        if texts is None:
            samples, texts, finished = cut_completions(samples, self.tokenizer, stop, self.pad_id)
        if cfg.slow_s:
            time.sleep(cfg.slow_s)
        t1 = time.monotonic()
        sampled = samples.mask_RT[:len(texts)] > 0
        versions = sorted(set(samples.versions_RT[:len(texts)][sampled].tolist())) or [self.version]
        jobs = envs.score_jobs(items, texts)
        rows = [(item, g) for item in items for g in range(item.group_size)]
        for job, (item, g) in zip(jobs, rows):  # the row each verdict is for, sealed into it (attest.py)
            job["seal"] = attest.context(item.item_id, item.lease, g)
        with self.timeline.span("verify", version=versions[0], programs=len(texts)):
            verdicts = self.verifiers.verify(jobs)
        verify_s = time.monotonic() - t1
        t2 = time.time()

        r = 0
        for item in items:
            rows_G = slice(r, r + item.group_size)
            group = samples.take(rows_G)
            per_token = len(versions) > 1 or cfg.inflight != lifecycle.OFF
            rollout = wire.Rollout(
                item_id=item.item_id, version=lifecycle.rollout_version(group.versions_RT, group.mask_RT),
                lineage=self.lineage, worker=cfg.name, prompt_len=int(group.prompt_len_R[0]),
                tokens_GT=group.tokens_RT, logp_behav_GT=group.logp_behav_RT, mask_GT=group.mask_RT,
                rewards_G=np.array([v.reward for v in verdicts[rows_G]], np.float32),
                finished_G=np.array(finished[rows_G], bool),
                statuses=[v.status for v in verdicts[rows_G]], macs=[v.mac for v in verdicts[rows_G]],
                texts=texts[rows_G], eval=item.eval, sample_s=sample_s, verify_s=verify_s,
                versions_GT=group.versions_RT if per_token else np.zeros((0, 0), np.int32), inflight=cfg.inflight,
                env_stats={k: [s[k][0] for s in env_stats[rows_G]] for k in ("turns", "tool_calls")}
                if env_stats else {})
            try:
                status = self.ps.call(wire.SubmitRollout(cfg.name, item.item_id, item.lease, rollout.to_dict()),
                                      what="rollout receipt").info.get("status")
            except wire.RemoteError as e:  # refused (not what the item asked for): it is sampled again
                status = f"refused: {e}"
            if status != "accepted":
                log(cfg, f"rollout {item.item_id} was {status}")
            r += item.group_size
        self.timeline.add("submit", t2, time.time(), version=versions[-1])
        n_tokens = int(samples.mask_RT.sum())
        infra = lifecycle.infra_failures([v.status for v in verdicts])
        log(cfg, f"v{'-'.join(map(str, versions[::max(len(versions) - 1, 1)]))}: {len(items)} items, "
                 f"{n_tokens} tokens in {sample_s:.2f}s ({n_tokens / max(sample_s, 1e-9):.0f} tok/s), "
                 f"verified in {verify_s:.2f}s, reward {np.mean([v.reward for v in verdicts]):.2f}"
                 + (f", {infra} verifier failures" if infra else ""))
        return len(items)

    # -- --inflight keep|recompute: rows streamed through continuous batching, weights swapped in flight
    def run_inflight(self) -> None:
        """The loop with in-flight weight updates. The decode slots stay busy: every inflight_steps
        decode steps we look for a new weight version (swapped into the rows in progress, `sync`),
        lease more items when no row is waiting for a slot, admit rows into free slots, and submit each
        item as soon as its G rows have ended. An item whose settings differ from the stream's (a
        greedy evaluation item) or of a multi-turn task is sampled on its own, with one version
        (sample_and_submit)."""
        cfg = self.cfg
        engine, stream, groups = None, None, {}  # groups: item_id -> [item, rows, monotonic start]
        while not cfg.max_batches or self.batches < cfg.max_batches:
            try:
                self.pull()
                engine = self.sync(engine, groups)
                if engine is None or not engine.waiting:
                    items = self.lease(wait_s=0.0 if engine is not None and engine.busy() else 1.0)
                    for item in items:
                        if item.env or (engine is not None and engine.busy() and settings(item) != stream):
                            self.batches += self.sample_or_report([item]) > 0  # episodes: turn by turn
                        elif self.wait_for_weights([item]) != lifecycle.ABANDON:
                            if engine is None or (not engine.busy() and settings(item) != stream):
                                engine, stream = self.new_engine(item), settings(item)
                            engine = self.sync(engine, groups)
                            groups[item.item_id] = [item, self.admit(engine, item), time.monotonic()]
                            continue
                        self.heartbeat.drop([item])
                if engine is None or not engine.busy():
                    continue
                with self.timeline.span("sample", version=engine.version, rows=engine.live()) as span:
                    before = engine.stats["decode_steps"]
                    ended = engine.step(max_steps=cfg.inflight_steps)
                    steps = engine.stats["decode_steps"] - before
                    if cfg.token_delay_s:
                        time.sleep(steps * cfg.token_delay_s)
                    span["tokens"] = sum(r.logp.size for r in ended)
                for item_id in dict.fromkeys(row.tag[0] for row in ended):  # an item's rows may end together
                    item, rows, t0 = groups[item_id]
                    if all(r.logp is not None for r in rows):
                        del groups[item.item_id]
                        self.submit_streamed(item, rows, time.monotonic() - t0)
                        self.heartbeat.drop([item])
                        self.batches += 1
            except (TimeoutError, wire.RemoteError) as e:
                log(cfg, f"{type(e).__name__}: {e}; retrying")
                time.sleep(0.5)

    def new_engine(self, item: wire.WorkItem) -> continuous.Slots:
        """A continuous-batching engine for items with this item's settings, on the weights we hold."""
        seq_len, max_new, temperature, top_p, stop = settings(item)
        engine = continuous.Slots(self.params, self.mcfg, slots=self.cfg.slots, cache_len=seq_len, width=max_new,
                                  version=self.version, temperature=temperature, top_p=top_p,
                                  eos_id=self.eos_for(stop), pad_id=self.pad_id)
        engine.lineage = self.lineage
        return engine

    def sync(self, engine, groups: dict):
        """Bring the engine to the weights we hold. Same lineage, newer version: swapped in between two
        decode steps, the rows in progress kept (--inflight keep: their KV cache as it is; recompute:
        recomputed under the new weights). Another lineage: the rows in progress belong to a trainer
        that is gone; they are dropped (lifecycle.worker_action's ABANDON) and the new one enqueues its own."""
        if engine is None or (engine.version, engine.lineage) == (self.version, self.lineage):
            return engine
        if engine.lineage != self.lineage:
            gone = {row.tag[0] for row in engine.drop(lambda row: True)} | set(groups)
            if gone:
                log(self.cfg, f"abandoning {len(gone)} items of trainer lineage {engine.lineage!r}: the param "
                              f"server now serves lineage {self.lineage!r}")
            self.heartbeat.drop([groups.pop(i)[0] for i in gone if i in groups])
            engine.lineage, engine.params, engine.version = self.lineage, self.params, self.version
            return engine
        t0 = time.time()
        engine.swap(self.params, self.version, self.cfg.inflight)
        self.timeline.add("swap", t0, time.time(), version=self.version, rows=engine.live())
        return engine

    def admit(self, engine: continuous.Slots, item: wire.WorkItem) -> list:
        """The item's G rows into the engine's queue, keyed by the item and the version they start with."""
        ids = self.tokenizer.encode(item.prompt)
        if not 0 < len(ids) <= item.seq_len - item.max_new_tokens:
            raise ValueError(f"item {item.item_id}: prompt of {len(ids)} tokens does not fit "
                             f"seq_len {item.seq_len} with max_new_tokens {item.max_new_tokens}")
        keys = row_keys(self.cfg.seed, [item], self.version, item.group_size)
        rows = [continuous.Row(np.asarray(ids, np.int32), keys[g], budget, tag=(item.item_id, g))
                for g, budget in enumerate(row_budgets(item, self.cfg.length_tail))]
        for row in rows:
            engine.add(row)
        return rows

    def submit_streamed(self, item: wire.WorkItem, rows: list, sample_s: float) -> None:
        """An item whose G rows all ended: laid out [G, T] with the version of each token, then finished."""
        self.finish([item], Samples.from_rows(rows, item.seq_len, self.pad_id), sample_s)

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
        log(self.cfg, f"started: param server {self.cfg.param_server}, verifier{'s' if len(self.verifiers.clients) > 1 else ''} "
                      f"{self.cfg.verifier}")
        self.hello()
        if self.cfg.inflight != lifecycle.OFF:
            return self.run_inflight()
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
    if problem := quant_unsupported(config.sampler_quant):  # restarting cannot help: stop the run
        print(f"{config.name}: cannot start: {problem}", flush=True)
        raise SystemExit(devices.EXIT_MISPLACED)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # preemption: leases expire, work is reissued
    try:
        worker = Worker(config)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"{config.name}: cannot start: {e}")
    worker.run()
