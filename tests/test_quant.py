"""The int8 sampler (quant.py, inference_worker --sampler-quant, launch.sh SAMPLER_QUANT).

Run: python -m pytest -q tests/test_quant.py      (about a minute on a 2-core CPU, most of it the launch.sh run)

Pure functions on hand-computed numbers (the scales and codes of a few channels, the error bound, a
zero channel), the chokepoint model.py:_einsum on quantised weights against the dequantised ones, the
quantised sampler's self-consistency (its log-probs are the quantised model's, bit for bit, and not the
bf16 trainer's), the worker's install, and one launch.sh run with SAMPLER_QUANT=int8 plus its resume.
"""
import json
import os
import re
import signal
import subprocess
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import grpo
import hf_io
import inference_worker
import model
import sampler
import quant
import versions
from conftest import ROOT, free_port, wait_until
from test_system import tiny  # noqa: F401  (the module-scoped tiny model fixture)


def test_quantise_hand_computed_channels():
    """w [L=1, D=2, F=3] contracted over D: channel 0 (2.54, -1.0) -> s 0.02, q (127, -50); channel 1 all
    zeros -> s 0, q 0 (no division by zero); channel 2 (0.3, 0.2) -> s 0.3/127, q (127, round(84.67) = 85)."""
    w = np.array([[[2.54, 0.0, 0.3], [-1.0, 0.0, 0.2]]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a 0 / 0 or x / 0 on the zero channel warns in numpy
        qw = quant.quantise(w, 1, 1)
    assert qw.q.dtype == jnp.int8 and qw.scale.dtype == jnp.float32
    assert qw.q.shape == (1, 2, 3) and qw.scale.shape == (1, 1, 3)
    np.testing.assert_array_equal(np.asarray(qw.q), [[[127, 0, 127], [-50, 0, 85]]])
    np.testing.assert_allclose(np.asarray(qw.scale)[0, 0], [0.02, 0.0, 0.3 / 127], rtol=1e-6)
    deq = np.asarray(quant.dequantise(qw))
    assert np.all(np.isfinite(deq)) and np.all(deq[..., 1] == 0)
    np.testing.assert_allclose(deq[0, :, 2], [0.3, 85 * 0.3 / 127], rtol=1e-6)


def test_quantise_error_is_at_most_half_a_step_per_channel():
    """Random stacked weights of every layout the model has: per output channel, |w - q s| <= s / 2
    (plus float32 rounding), the channel's largest |w| is coded as +-127 exactly, and the scale has
    size 1 on the contracted axes only (o_proj contracts two)."""
    rng = np.random.default_rng(0)
    for shape, n_contract in (((3, 16, 4, 8), 1), ((3, 4, 8, 16), 2), ((2, 32, 24), 1)):
        w = (rng.standard_normal(shape) * rng.uniform(0.01, 3.0, (shape[0],) + (1,) * n_contract
                                                      + shape[1 + n_contract:])).astype(np.float32)
        qw = quant.quantise(w, 1, n_contract)
        axes = tuple(range(1, 1 + n_contract))
        s = np.asarray(qw.scale)
        assert s.shape == tuple(1 if i in axes else n for i, n in enumerate(shape))
        err = np.abs(w - np.asarray(quant.dequantise(qw)))
        assert np.all(err <= s / 2 * (1 + 1e-5) + 1e-12), float((err / s).max())
        assert np.all(np.max(np.abs(np.asarray(qw.q, np.int32)), axis=axes) == 127)
        np.testing.assert_allclose(s, np.max(np.abs(w), axis=axes, keepdims=True) / 127, rtol=1e-6)


def test_numpy_and_jax_quantise_alike():
    """The worker quantises device arrays with jax, the tests host arrays with numpy: the same codes and
    scales, bit for bit, on bf16 weights with many exact halves."""
    w = np.asarray(jnp.asarray(np.random.default_rng(1).standard_normal((2, 64, 3, 8)), jnp.bfloat16))
    for fmt in quant.FORMATS:
        a, b = quant.quantise(w, 1, 2, fmt), quant.quantise(jnp.asarray(w), 1, 2, fmt)
        assert isinstance(a.q, np.ndarray) and isinstance(b.q, jax.Array)
        assert np.array_equal(a.q.astype(np.float32), np.asarray(b.q).astype(np.float32))
        assert np.array_equal(a.scale, np.asarray(b.scale))


def test_fp8_codes_and_bad_formats():
    w = np.array([[[448.0 * 0.01, 0.0], [-0.01, 0.0]]], np.float32)
    qw = quant.quantise(w, 1, 1, "fp8")
    assert qw.q.dtype == jnp.float8_e4m3fn
    np.testing.assert_array_equal(np.asarray(qw.q, np.float32), [[[448.0, 0.0], [-1.0, 0.0]]])
    with pytest.raises(ValueError, match="unknown quantisation format"):
        quant.quantise(w, 1, 1, "int4")
    with pytest.raises(ValueError, match="no output axis"):
        quant.quantise(w, 1, 2)


def _small(dtype="float32", bf16_fix=True):
    cfg = model.ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                            intermediate_size=48, max_seq_len=64, rope_theta=1e4, rms_norm_eps=1e-6, qkv_bias=True,
                            tie_embeddings=False, dtype=dtype, bf16_fix=bf16_fix)
    rng = np.random.default_rng(0)  # numpy, like init_params (unit norms), without its compiles
    init = lambda path, s: (np.ones(s) if "norm" in jax.tree_util.keystr(path)  # noqa: E731
                            else 0.05 * rng.standard_normal(s)).astype(cfg.jdtype)
    return cfg, jax.tree_util.tree_map_with_path(init, model._param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple))


def test_params_tree_what_is_quantised_and_its_bytes():
    cfg, params = _small("bfloat16")
    qp = quant.quantise_params(params)
    assert quant.quantise_params(params, "none") is params            # the default path: the weights as given
    for name, leaf in qp["layers"].items():
        assert isinstance(leaf, quant.QuantWeight) == (name in quant.QUANTISED), name
    for name in ("embed", "lm_head", "final_norm"):
        assert qp[name] is params[name]
    # bytes: every projection 2 -> 1 byte per weight, plus 4 bytes per output channel per layer
    L, D, N, K, H, F = 2, 32, 4, 2, 8, 48
    proj = L * (D * N * H + 2 * D * K * H + N * H * D + 2 * D * F + F * D)
    channels = L * (N * H + 2 * K * H + D + 2 * F + D)
    assert quant.params_bytes(params) - quant.params_bytes(qp) == proj - 4 * channels


def test_the_matmul_chokepoint_on_quantised_weights_is_the_dequantised_model():
    """float32 model: forward on the QuantWeights equals forward on their dequantised float32 weights
    (same math, f32 rounding apart) for every projection layout, and differs from the unquantised
    weights; a scale laid out on the wrong output axis would fail the first check."""
    cfg, params = _small("float32")
    qp = quant.quantise_params(params)
    deq = {**qp, "layers": {k: quant.dequantise(v) if isinstance(v, quant.QuantWeight) else v
                            for k, v in qp["layers"].items()}}
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 64, (2, 24)), jnp.int32)
    a, b, c = (np.asarray(model.forward(p, cfg, tokens)) for p in (qp, deq, params))
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)
    assert np.abs(a - c).max() > 1e-3
    assert quant.output_scale("BTNH,NHD->BTD", jnp.zeros((1, 1, 5))).shape == (1, 1, 5)
    assert quant.output_scale("BTD,DNH->BTNH", jnp.zeros((1, 3, 4))).shape == (1, 1, 3, 4)


def test_quantised_sampler_reports_its_own_logprobs_bitwise_not_the_trainers():
    """bf16 with the precision policy: generate() on int8 weights reports exactly token_logprobs on the
    same int8 weights (the policy holds for them too), so against the bf16 trainer's log-probs the whole
    difference is the quantisation's: nonzero on most tokens, small on average."""
    cfg, params = _small("bfloat16")
    qp = quant.quantise_params(params)
    B, T, P = 16, 32, 4
    prompt = np.zeros((B, T), np.int32)
    prompt[:, :P] = np.random.default_rng(2).integers(1, 64, (B, P))
    out = sampler.generate(qp, cfg, prompt, np.full(B, P), jax.random.PRNGKey(3), max_new_tokens=12, fit=False)
    tokens, mask = jnp.asarray(out.tokens_RT), out.mask_RT > 0
    own = np.asarray(model.token_logprobs(qp, cfg, tokens))
    assert np.array_equal(own[mask], out.logp_behav_RT[mask])
    mm = grpo.mismatch_metrics(out.logp_behav_RT, model.token_logprobs(params, cfg, tokens), out.mask_RT)
    assert float(mm["bitwise_frac"]) < 0.5 and 0 < float(mm["k3_kl"]) < 0.05, mm


def test_worker_settings_and_install():
    """--sampler-quant: only none, int8, fp8; not with tensor parallelism; fp8 refused on this CPU with a
    reason; install quantises (int8) or leaves the pushed weights as they are (none)."""
    base = dict(verifier="tcp://127.0.0.1:1")
    assert inference_worker.Config(**base).sampler_quant == "none"
    with pytest.raises(ValueError, match="--sampler-quant must be one of"):
        inference_worker.Config(**base, sampler_quant="int4")
    with pytest.raises(ValueError, match="needs --tensor-parallel 1"):
        inference_worker.Config(**base, sampler_quant="int8", tensor_parallel=2)
    assert inference_worker.quant_unsupported("int8") == ""
    assert inference_worker.quant_unsupported("none") == ""
    assert "compute capability >= 8.9" in inference_worker.quant_unsupported("fp8", jax.devices("cpu")[0])

    cfg, params = _small("bfloat16")
    tensors = hf_io.to_hf_tensors(params, cfg)
    for mode in ("none", "int8"):
        worker = inference_worker.Worker.__new__(inference_worker.Worker)  # install alone, no sockets
        worker.cfg = inference_worker.Config(**base, sampler_quant=mode, name="w")
        worker.mcfg, worker.mesh, worker.version = cfg, None, -1
        worker.install(versions.from_arrays(7, "x", list(tensors.items())))
        q = worker.params["layers"]["down_proj"]
        assert isinstance(q, quant.QuantWeight) == (mode == "int8") and worker.version == 7
        if mode == "none":
            assert np.array_equal(np.asarray(q), np.asarray(params["layers"]["down_proj"]))


# ---------------------------------------------------------------------------------------- launch.sh

CORRECTION = "--is-correction icepop --geo-reject --veto-ratio 0.05"  # token band + sequence rejection + veto
TRAINER_ARGS = f"--heldout 2 --eval-samples 8 --eval-every 0 --prompts-per-step 4 --checkpoint-every 1 {CORRECTION}"


def _steps(run_dir) -> list:
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip() and "reward/mean" in line]
    except (OSError, ValueError):
        return []


@pytest.fixture(scope="module")
def int8_run(tmp_path_factory, tiny):  # noqa: F811
    """One launch.sh run with SAMPLER_QUANT=int8 and grpo.py's rollout corrections (IcePop's token band,
    the geometric-mean sequence rejection and the veto together). Once a step is checkpointed its
    trainer is SIGKILLed; launch.sh restarts it with --resume; one step after the resume the run is
    stopped (Ctrl-C's path: SIGTERM to launch.sh)."""
    run_dir = str(tmp_path_factory.mktemp("int8") / "run")
    env = {**os.environ, "RUN_DIR": run_dir, "STEPS": "50", "WORKERS": "1", "MODEL": tiny, "PORT": str(free_port()),
           "SAMPLER_QUANT": "int8", "WORKER_ARGS": "--lease-s 5", "TRAINER_ARGS": TRAINER_ARGS,
           "RECIPE": "--kl-beta 0.1"}
    log_path = run_dir + ".launch.log"
    proc = subprocess.Popen(["bash", "launch.sh"], cwd=ROOT, env=env, stdout=open(log_path, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    trainer_log = os.path.join(run_dir, "trainer.log")
    try:
        wait_until(lambda: os.path.isdir(os.path.join(run_dir, "checkpoints", "step_000001")), 240, "step 1's checkpoint")
        os.killpg(int(open(os.path.join(run_dir, "pids", "trainer")).read()), signal.SIGKILL)
        resumed = wait_until(lambda: re.search(r"resumed from step (\d+)", open(trainer_log).read()), 120, "the resume")
        k = int(resumed.group(1))
        wait_until(lambda: any(r["step"] > k for r in _steps(run_dir)), 120, "a step after the resume")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    return run_dir, _steps(run_dir), k, open(log_path, errors="replace").read()


def test_launch_sh_int8_samples_quantised_and_logs_the_mismatch(int8_run):
    run_dir, steps, _, _ = int8_run
    assert "--sampler-quant int8" in open(os.path.join(run_dir, "commands.sh")).read()
    assert "sampling with int8 weights" in open(os.path.join(run_dir, "worker-0.log")).read()
    assert len(steps) >= 2
    for r in steps:  # on-policy, the same version: the whole difference is the quantisation's
        assert r["staleness/max"] == 0 and r["mismatch/num_tokens"] > 0
        assert r["mismatch/bitwise_frac"] < 1.0 and r["mismatch/k3_kl"] > 0 and r["mismatch/max_abs_logp_diff"] > 0, r
        # ... and the correction sees it: log rho = log pi_old - log pi_behav spreads, the loss stays finite
        assert r["correction/log_ratio_std"] > 0 and np.isfinite(r["loss/total"]), r


def test_launch_sh_int8_resumes(int8_run):
    run_dir, steps, k, log = int8_run
    assert k >= 1 and re.search(r"trainer exited \(status \d+\); restart #1", log), log[-2000:]
    assert CORRECTION in open(os.path.join(run_dir, "commands.sh")).read()   # the restarted trainer's line too
    assert max(r["step"] for r in steps) > k


def test_launch_sh_refuses_an_unknown_sampler_quant(tmp_path):
    env = {**os.environ, "RUN_DIR": str(tmp_path / "run"), "SAMPLER_QUANT": "int4"}
    proc = subprocess.run(["bash", "launch.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "SAMPLER_QUANT=int4: expected none, int8 or fp8" in proc.stderr
    assert not os.path.exists(tmp_path / "run")
