"""A LoRA run's resume and its --lora-init adapter (docs/lora.md "Checkpoints, resume, --lora-init"):
the checkpoint records the init adapter (its folder and lora.fingerprint), a resume with another, a
changed or a missing one (or one given where the checkpoint had none) is refused naming both, --lora-*
flags that contradict the init adapter's adapter_config.json are refused at start, and final/adapter
applied to the base gives the trained policy.

Real Trainer objects (trainer.Trainer, no param server: nothing here talks to one) on one tiny model:
build_update with --lora-init, a trained adapter put in its master, checkpoint (do_checkpoint), --resume
(do_restore) and export (do_export). About 20 s, most of it the first merge's compile.

Run: python -m pytest -q tests/test_lora_resume.py
"""
import json
import os
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import checkpointing
import grpo
import hf_io
import lora
import model
import trainer
import update
from random_weights import random_params
from trainer_config import Config

CFG = model.ModelConfig(vocab_size=259, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                        intermediate_size=48, max_seq_len=64, rope_theta=1e4, rms_norm_eps=1e-6, qkv_bias=True,
                        tie_embeddings=True)
LCFG = lora.LoraConfig(2, 8.0, ("q_proj", "down_proj"))
FLAGS = {"lora_rank": 2, "lora_alpha": 8.0, "lora_targets": "q_proj,down_proj"}  # LCFG as flags


def adapter_folder(path, seed):
    """A PEFT folder of LCFG with B != 0 (a real init adapter is a trained one), drawn in numpy."""
    rng = np.random.default_rng(seed)
    adapter = {t: {m: (0.05 * rng.standard_normal(s)).astype(np.float32) for m, s in ms.items()}
               for t, ms in lora.adapter_shapes(CFG, LCFG).items()}
    hf_io.save_peft_adapter(str(path), CFG, LCFG, adapter)
    return str(path)


def make_trainer(w, run_dir, resume=False, **flags):
    cfg = Config(run_dir=str(run_dir), model=w["model"], heldout=2, steps=1, resume=resume,
                 param_server="tcp://127.0.0.1:9", **flags)
    return trainer.Trainer(cfg, grpo.GRPOConfig())


def trained(t):
    """t's adapter as training leaves it (B != 0), drawn in numpy: the state a checkpoint holds after
    some steps, without compiling the update (the checkpoint and its resume are what is tested here)."""
    rng = np.random.default_rng(7)
    adapter = {tgt: {m: (0.05 * rng.standard_normal(np.shape(x))).astype(np.float32) for m, x in ms.items()}
               for tgt, ms in host(t.master).items()}
    t.master, t.opt_state = update.init_lora_state(adapter, t.optimizer)


def host(tree):
    return jax.tree_util.tree_map(np.asarray, tree)


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """The tiny model, the init adapter folder, another of the same config, and a run started from the
    init adapter with a trained adapter, checkpointed (run_init/)."""
    root = tmp_path_factory.mktemp("lora_resume")
    w = {"root": root, "model": str(root / "model")}
    hf_io.save_hf(w["model"], CFG, random_params(CFG, 0))
    w["init"], w["other"] = adapter_folder(root / "init", 1), adapter_folder(root / "other", 2)
    t = make_trainer(w, root / "run_init", lora_init=w["init"])
    trained(t)
    t.checkpoint()
    w["trained"] = host(t.master)
    return w


def copy_run(w, tmp_path, name="run_init"):
    shutil.copytree(w["root"] / name, tmp_path / "run")
    return tmp_path / "run"


def checkpoint_meta(run_dir):
    name = checkpointing.list_checkpoints(str(run_dir))[-1]
    return json.load(open(os.path.join(run_dir, "checkpoints", name, "meta.json")))


def test_the_checkpoint_records_the_init_and_a_resume_with_its_tensors_exports_the_trained_policy(w, tmp_path, capsys):
    """meta.json holds the init adapter's absolute folder and sha256 (lora.fingerprint of the adapter as
    loaded: a hash of its tensors and config, so the same tensors saved again, in another file, hash the
    same). A resume from a moved copy of the folder, re-saved with other metadata, is accepted (and says
    so); the adapter comes back bit for bit; final/adapter is one rank-2r adapter for the base whose merge
    is final/'s policy up to one bf16 rounding, and the init adapter is in it (the trained one alone is
    far from the policy)."""
    _, init_adapter = hf_io.load_peft_adapter(w["init"], CFG)
    sha = lora.fingerprint(init_adapter, LCFG)
    meta = checkpoint_meta(w["root"] / "run_init")
    assert meta["lora"] == LCFG.to_dict()
    assert meta["lora_init"] == {"path": os.path.abspath(w["init"]), "sha256": sha}

    moved = tmp_path / "moved"  # the same tensors, written again: another order, other metadata
    moved.mkdir()
    shutil.copy(os.path.join(w["init"], hf_io.PEFT_CONFIG), moved)
    tensors = load_file(os.path.join(w["init"], hf_io.PEFT_WEIGHTS))
    save_file(dict(reversed(list(tensors.items()))), str(moved / hf_io.PEFT_WEIGHTS), metadata={"saved": "again"})
    assert open(moved / hf_io.PEFT_WEIGHTS, "rb").read() != open(os.path.join(w["init"], hf_io.PEFT_WEIGHTS), "rb").read()
    assert lora.fingerprint(hf_io.load_peft_adapter(str(moved), CFG)[1], LCFG) == sha

    run = copy_run(w, tmp_path)
    capsys.readouterr()
    t = make_trainer(w, run, resume=True, lora_init=str(moved), lora_alpha=8.0)  # a flag equal to the folder's
    assert "holds the same adapter as" in capsys.readouterr().out
    for tgt in LCFG.targets:
        for m in "AB":
            assert np.array_equal(np.asarray(t.master[tgt][m]), w["trained"][tgt][m])

    final = t.export_policy()
    policy = t.update.policy(t.master)  # what the workers sample: base merged with init, then with ours
    lcfg2, exported = hf_io.load_peft_adapter(os.path.join(final, "adapter"), CFG)
    assert lcfg2 == lora.LoraConfig(4, 16.0, LCFG.targets) and lcfg2.scale == LCFG.scale
    _, saved = hf_io.load_hf(final)
    _, base = hf_io.load_hf(w["model"])
    applied = lora.merge(base, exported, CFG, lcfg2)
    trained_only = lora.merge(base, w["trained"], CFG, LCFG)
    for tgt in LCFG.targets:
        got = np.asarray(saved["layers"][tgt], np.float32)
        assert np.array_equal(got, np.asarray(policy["layers"][tgt], np.float32))  # final/ is the policy, exactly
        want = np.asarray(applied["layers"][tgt], np.float32)
        # The policy is round(round(W + init) + ours), the PEFT folder's merge round(W + init + ours): they
        # differ by the inner rounding (half a bf16 ulp of W + init, t.base) and the outer one's change
        with_init = np.asarray(t.base["layers"][tgt], np.float32)
        assert np.all(np.abs(got - want) <= 2.0 ** -8 * (np.abs(with_init) + np.abs(got) + np.abs(want)) + 1e-7), tgt
        assert np.mean(got == want) > 0.5, tgt
        assert np.abs(got - np.asarray(trained_only["layers"][tgt], np.float32)).max() > 1e-2, tgt


def test_a_resume_with_a_missing_other_or_changed_init_adapter_is_refused_naming_both(w, tmp_path):
    """From the run started on the init adapter: resumed without --lora-init (the same --lora-* config),
    with another folder of the same config, with no LoRA flag at all; a run whose init folder changed
    in place; a run with no init adapter resumed with one. Each is refused, the message naming the
    checkpoint's init (folder and sha256, or none) and this run's."""
    run = copy_run(w, tmp_path)
    with pytest.raises(ValueError) as e:
        make_trainer(w, run, resume=True, **FLAGS)
    meta = checkpoint_meta(run)
    recorded = f"--lora-init {meta['lora_init']['path']} (adapter sha256 {meta['lora_init']['sha256']})"
    assert recorded in str(e.value) and "this run gives no --lora-init" in str(e.value), str(e.value)

    other_sha = lora.fingerprint(hf_io.load_peft_adapter(w["other"], CFG)[1], LCFG)
    assert other_sha != meta["lora_init"]["sha256"]
    with pytest.raises(ValueError) as e:
        make_trainer(w, run, resume=True, lora_init=w["other"])
    assert recorded in str(e.value) and f"--lora-init {w['other']} (adapter sha256 {other_sha})" in str(e.value)

    with pytest.raises(ValueError) as e:  # no LoRA at all: the config and the init both named
        make_trainer(w, run, resume=True)
    assert "LoRA config" in str(e.value) and recorded in str(e.value), str(e.value)

    # the same folder, its tensors changed after the checkpoint
    changing = adapter_folder(tmp_path / "changing", 3)
    t = make_trainer(w, tmp_path / "run2", lora_init=changing)
    t.checkpoint()
    before = checkpoint_meta(tmp_path / "run2")["lora_init"]
    tensors = load_file(os.path.join(changing, hf_io.PEFT_WEIGHTS))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + np.float32(1e-3)
    save_file(tensors, os.path.join(changing, hf_io.PEFT_WEIGHTS), metadata={"format": "pt"})
    with pytest.raises(ValueError) as e:
        make_trainer(w, tmp_path / "run2", resume=True, lora_init=changing)
    assert before["sha256"] in str(e.value) and "its tensors changed" in str(e.value), str(e.value)
    assert str(e.value).count(os.path.abspath(changing)) == 2

    # a run with no init adapter, resumed with one of its very config
    t = make_trainer(w, tmp_path / "run3", **FLAGS)
    t.checkpoint()
    assert checkpoint_meta(tmp_path / "run3")["lora_init"] is None
    with pytest.raises(ValueError) as e:
        make_trainer(w, tmp_path / "run3", resume=True, lora_init=w["init"])
    assert "trained with no --lora-init" in str(e.value) and meta["lora_init"]["sha256"] in str(e.value), str(e.value)
    make_trainer(w, tmp_path / "run3", resume=True, **FLAGS)  # and without one it resumes


def test_lora_flags_that_contradict_the_init_adapter_are_refused_at_start(w):
    """With --lora-init, the folder's adapter_config.json is the run's LoRA config (as in PEFT, whose
    from_pretrained takes it from there): --lora-rank, --lora-alpha or --lora-targets may repeat it but
    not differ from it, each checked on its own (with or without --lora-rank), at Config time, before
    any model is loaded. None is silently ignored."""
    for flags, named in (({"lora_alpha": 16.0}, "--lora-alpha 16 (the folder's lora_alpha is 8)"),
                         ({"lora_targets": "q_proj"}, "--lora-targets q_proj (the folder's target_modules are q_proj,down_proj)"),
                         ({"lora_rank": 4}, "--lora-rank 4 (the folder's r is 2)"),
                         ({"lora_rank": 2, "lora_alpha": 32.0}, "--lora-alpha 32"),
                         ({"lora_targets": "q_proj,down_proj,v_proj"}, "--lora-targets q_proj,down_proj,v_proj")):
        with pytest.raises(ValueError) as e:
            Config(run_dir="unused", lora_init=w["init"], **flags)
        assert named in str(e.value) and w["init"] in str(e.value), (flags, str(e.value))
    with pytest.raises(ValueError, match="--lora-alpha 16"):  # the same rule where the adapter is read
        hf_io.lora_start(CFG, 0, 16.0, "", w["init"])
    for flags in ({}, FLAGS, {"lora_targets": "down_proj, q_proj"}, {"lora_alpha": 8}):  # the folder's values
        Config(run_dir="unused", lora_init=w["init"], **flags)
    assert hf_io.lora_start(CFG, 0, 0.0, "down_proj,q_proj", w["init"])[0] == LCFG
