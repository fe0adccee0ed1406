"""checkpointing.py: the trainer's state on disk, and the ledger's rewind on resume.

    $RUN_DIR/checkpoints/step_N/state.safetensors   f32 master weights ("master/<path>") and the optimizer
                                                  state's leaves in order ("opt/0000", ...)
    $RUN_DIR/checkpoints/step_N/meta.json           step, data cursor, fate counts, prompts in flight,
                                                  the ledger's length, wall time, and a CRC32 per tensor;
                                                  LoRA: the config ("lora") and the --lora-init adapter
                                                  ("lora_init": path and sha256, or null), which a resume
                                                  must match (check_lora_resume)

Written into step_N.tmp/ and renamed, so a checkpoint is whole or absent; read back only if every CRC
and every parameter name checks out, else the previous one is used. Across hosts (multihost.py) every
trainer process calls save and load: the tensors are gathered to, or sent from, process 0, the only one
that touches the files.
"""
from __future__ import annotations

import json
import os
import shutil
import zlib

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

import multihost


def list_checkpoints(run_dir: str) -> list[str]:
    """The finished checkpoints' folder names under run_dir/checkpoints, oldest first (a step_N.tmp
    folder is a write that did not finish: never listed)."""
    root = os.path.join(run_dir, "checkpoints")
    return sorted(d for d in os.listdir(root) if d.startswith("step_") and not d.endswith(".tmp")) \
        if os.path.isdir(root) else []


def save_checkpoint(run_dir: str, step: int, master, opt_state, meta: dict, keep: int) -> str:
    """Atomic: everything is written into step_N.tmp/, then the folder is renamed to step_N/.
    A crash mid-write leaves a .tmp folder that load ignores (invariant 5).
    Across hosts every trainer process calls it (each tensor is gathered from its shards, a collective)
    and only the leader writes: one checkpoint, in the same format whatever the host count."""
    tensors = {f"master/{k}": multihost.to_host(v) for k, v in _flat(master).items()}
    tensors.update({f"opt/{i:04d}": multihost.to_host(v) for i, v in enumerate(jax.tree_util.tree_leaves(opt_state))})
    if not multihost.is_leader():
        return ""
    root = os.path.join(run_dir, "checkpoints")
    final, tmp = os.path.join(root, f"step_{step:06d}"), os.path.join(root, f"step_{step:06d}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    save_file(tensors, os.path.join(tmp, "state.safetensors"))
    meta = {**meta, "step": step, "crc32": {k: zlib.crc32(np.ascontiguousarray(v).tobytes())
                                            for k, v in tensors.items()}}
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    return final


class ResumeRefused(ValueError):
    """The checkpoint is whole, but this run may not continue it (check_lora_resume): never a reason to
    try an older checkpoint."""


def read_checkpoint(run_dir: str, master_like, check=None) -> tuple[dict, dict]:
    """(tensors by name, meta) of the newest checkpoint that verifies (every CRC, the model's parameter
    names); a truncated or corrupt one is reported and the previous one tried. check(meta), if given,
    runs on its meta.json before the tensors are read; the ResumeRefused it may raise ends the search."""
    root = os.path.join(run_dir, "checkpoints")
    for name in reversed(list_checkpoints(run_dir)):
        path = os.path.join(root, name)
        try:
            with open(os.path.join(path, "meta.json")) as f:
                meta = json.load(f)
            if check is not None:
                check(meta)
            tensors = load_file(os.path.join(path, "state.safetensors"))
            for k, v in tensors.items():
                if zlib.crc32(np.ascontiguousarray(v).tobytes()) != meta["crc32"][k]:
                    raise ValueError(f"checksum mismatch in {k}")
            if set(_flat(master_like)) != {k[len("master/"):] for k in tensors if k.startswith("master/")}:
                raise ValueError("parameter names differ from the model's")
            return tensors, meta
        except ResumeRefused:
            raise
        except Exception as e:  # any failure to read means: not a good checkpoint
            print(f"[trainer] checkpoint {path} is unusable ({type(e).__name__}: {e}); trying an older one",
                  flush=True)
    raise FileNotFoundError(f"no usable checkpoint in {root}")


def load_checkpoint(run_dir: str, master_like, opt_like, on_mesh: bool = False, check=None):
    """(master, opt_state, meta) from the newest checkpoint that verifies (read_checkpoint; check, run on
    the leader, may refuse it with ResumeRefused, which every process then raises).
    on_mesh: every array goes from the host straight into the sharding of its *_like leaf. Across hosts
    every trainer process calls it: the leader reads the files and sends each tensor, bit for bit, to
    the others (multihost.broadcast_array), so only the leader's disk holds checkpoints."""
    tensors, meta = {}, None
    if multihost.is_leader():
        try:
            tensors, meta = read_checkpoint(run_dir, master_like, check)
        except FileNotFoundError as e:
            meta = {"error": str(e)}
        except ResumeRefused as e:
            meta = {"refused": str(e)}
    meta = multihost.broadcast(meta)
    if "error" in meta:
        raise FileNotFoundError(meta["error"])
    if "refused" in meta:
        raise ResumeRefused(meta["refused"])

    def put(name, like):
        x = multihost.broadcast_array(tensors.get(name), like.shape, like.dtype)
        return jax.device_put(x, like.sharding) if on_mesh else jnp.asarray(x)
    master = _unflat(master_like, {k: f"master/{k}" for k in _flat(master_like)}, put)
    opt_leaves, treedef = jax.tree_util.tree_flatten(opt_like)
    opt_state = jax.tree_util.tree_unflatten(treedef, [put(f"opt/{i:04d}", like) for i, like in enumerate(opt_leaves)])
    return master, opt_state, meta


def check_lora_resume(meta: dict, lora_cfg: dict | None, init: dict | None) -> str:
    """May this run resume from a checkpoint whose meta.json is `meta`? lora_cfg: this run's LoRA
    config (LoraConfig.to_dict(), None for full fine-tuning); init: this run's --lora-init record,
    {"path": absolute folder, "sha256": lora.fingerprint of its adapter}, or None without one.
    A LoRA checkpoint's policy is base + init adapter + trained adapter, and only the trained adapter is
    in the checkpoint: the resumed run must merge the same init adapter into the same base, or its
    policy jumps (and final/adapter loses the init). So ResumeRefused, naming both sides, unless the
    LoRA configs are equal and the init adapters are the same tensors: the same sha256, wherever the
    folder now is (a moved or copied folder passes; the same folder with other tensors does not).
    Returns a line to log ("" when there is nothing to say): the folder moved, or a checkpoint written
    before init adapters were recorded (meta without "lora_init"), which cannot be checked."""
    problems, note = [], ""
    if meta.get("lora") != lora_cfg:
        problems.append(f"the checkpoint's LoRA config is {meta.get('lora')}, this run's {lora_cfg} "
                        "(resume with the --lora-* flags it was trained with)")
    if meta.get("lora") is not None:
        if "lora_init" not in meta:
            note = ("this checkpoint predates the recording of --lora-init: whether it was trained on top of "
                    f"an init adapter cannot be checked; resuming with {_init_text(init)}")
        else:
            recorded = meta["lora_init"]
            if (recorded or {}).get("sha256") != (init or {}).get("sha256"):
                same = recorded and init and recorded["path"] == init["path"]
                problems.append(f"the checkpoint was trained with {_init_text(recorded)}, this run gives "
                                f"{_init_text(init)}" + (" (the same folder: its tensors changed since)" * bool(same))
                                + ": resume with the checkpoint's --lora-init adapter (the same tensors; the folder "
                                  "may have moved)")
            elif recorded and recorded["path"] != init["path"]:
                note = (f"--lora-init {init['path']} holds the same adapter as {recorded['path']}, which the "
                        f"checkpoint recorded (sha256 {init['sha256']}): resuming on it")
    if problems:
        raise ResumeRefused("cannot resume: " + "; ".join(problems))
    return note


def _init_text(init: dict | None) -> str:
    return f"--lora-init {init['path']} (adapter sha256 {init['sha256']})" if init else "no --lora-init"


def rewind_ledger(path: str, lines: int) -> int:
    """On resume: keep the ledger's first `lines` lines (its length at the checkpoint); the fates
    decided after it belong to steps that are redone. Returns the count kept."""
    kept = []
    if os.path.exists(path):
        with open(path) as f:
            kept = f.readlines()[:lines]
        with open(path + ".tmp", "w") as f:
            f.writelines(kept)
        os.replace(path + ".tmp", path)
    return len(kept)


def _flat(tree) -> dict:
    return {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _unflat(like, flat: dict, put=lambda x, like: jnp.asarray(x)):
    paths, treedef = jax.tree_util.tree_flatten_with_path(like)
    return jax.tree_util.tree_unflatten(treedef, [put(flat[jax.tree_util.keystr(p)], leaf) for p, leaf in paths])
