"""Trainer pieces that need no processes. Run: python -m pytest -q tests/test_trainer.py"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import checkpointing
import cli
import grpo
import model
import trainer
import update

CFG = model.ModelConfig(vocab_size=259, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                        intermediate_size=64, max_seq_len=24, rope_theta=1e4, rms_norm_eps=1e-6, qkv_bias=False,
                        tie_embeddings=True, model_type="llama")


OPT = optax.sgd(lambda step: 5.0)  # plain SGD, a large lr (5); its state counts the optimizer steps
MASTER = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), model.init_params(CFG, jax.random.PRNGKey(0)))
MAX_LEN = 16  # the generation budget: shorter than T = 24 (prompt + completion), longer than any completion


@functools.lru_cache(maxsize=None)
def update_for(agg):
    """One update per aggregation, shared by the tests below: its jitted graphs compile once per shape."""
    return update.make_update(CFG, grpo.GRPOConfig(loss_agg=agg, max_len=MAX_LEN, is_correction="none"), OPT, 1.0)


def batch(B, seed=0):
    """B rows of T = 24 tokens; row b's completion is positions 8 .. 8 + (b % 12) - 1 (one row per 12 empty)."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((B, 24), np.float32)
    for b in range(B):
        mask[b, 8:8 + b % 12] = 1.0
    return {"tokens_RT": rng.integers(0, 256, (B, 24)).astype(np.int32),
            "adv_R": rng.standard_normal(B).astype(np.float32), "mask_RT": mask,
            "logp_behav_RT": np.zeros((B, 24), np.float32)}


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_gradient_accumulation_equals_one_big_batch(agg):
    """Microbatches weighted by grpo.microbatch_weight give the full-batch update (f32 rounding aside)."""
    B = 12
    data, update_fn = batch(B), update_for(agg)
    results = []
    for size in (B, 5):  # one batch; microbatches of 5, 5, 2
        new, _, logp, aux = update_fn(MASTER, OPT.init(MASTER), update.split_batch(data, 1, size))
        results.append((new, logp, aux["loss"]))
    for new, logp, loss in results[1:]:
        np.testing.assert_allclose(loss, results[0][2], rtol=1e-5, atol=1e-7)
        assert np.array_equal(logp, results[0][1])  # log-probs do not depend on the microbatch size
        # The backward runs in bf16, so per-microbatch gradients round differently; a wrong weighting
        # would be off by a factor (2x, 3x), far outside this bf16-sized tolerance on the update.
        for a, b, m in zip(*(jax.tree_util.tree_leaves(t) for t in (new, results[0][0], MASTER))):
            delta_a, delta_b = np.asarray(a) - np.asarray(m), np.asarray(b) - np.asarray(m)
            assert np.abs(delta_a - delta_b).max() <= 2e-2 * np.abs(delta_b).max() + 1e-8


def test_drgrpo_max_len_is_the_completion_budget():
    """Dr. GRPO with max_len = 16 on rows of T = 24 (prompt + completion): completions of at most 11
    tokens fit the budget, so this must train (it used to raise at step 1, T > max_len). At the first
    step the ratio is 1, so the loss is -sum_b A_b |y_b| / (B * max_len) with the constant max_len."""
    B = 12
    data = batch(B)
    _, _, _, aux = update_for("seq_mean_token_sum_norm")(MASTER, OPT.init(MASTER), update.split_batch(data, 1, B))
    expected = -(data["adv_R"] * data["mask_RT"].sum(1)).sum() / (B * MAX_LEN)
    np.testing.assert_allclose(aux["loss"], expected, rtol=1e-5)


def test_ppo_epochs_and_minibatches_make_the_clip_act():
    """One optimizer step per batch: ratio 1, clip fractions exactly 0. Several (epochs x minibatches):
    the later steps see pi != pi_old and the clip acts. pi_old, the log-probs returned for every row,
    are those at the starting weights, bit for bit, whatever the number of steps."""
    data, update_fn = batch(24), update_for("token_mean")  # microbatches of 12 rows throughout
    runs = {}
    for epochs, minibatches in ((1, 1), (2, 1), (1, 2), (2, 2)):
        _, opt_state, logp, aux = update_fn(MASTER, OPT.init(MASTER), update.split_batch(data, minibatches, 12),
                                         epochs=epochs)
        assert int(optax.tree_utils.tree_get(opt_state, "count")) == epochs * minibatches  # optimizer steps
        runs[epochs, minibatches] = logp, aux
    logp_start, aux_one_step = runs[1, 1]
    assert aux_one_step["clip_frac_low"] == 0.0 and aux_one_step["clip_frac_high"] == 0.0
    for key, (logp, aux) in runs.items():
        assert np.array_equal(logp, logp_start), key  # pi_old: the starting weights' log-probs, every row
        if key != (1, 1):
            assert aux["clip_frac_low"] + aux["clip_frac_high"] > 0, key


def test_checkpoint_round_trip_and_corruption(tmp_path):
    master = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), model.init_params(CFG, jax.random.PRNGKey(1)))
    opt = optax.adam(1e-3)
    state = opt.init(master)
    checkpointing.save_checkpoint(str(tmp_path), 3, master, state, {"cursor": 7}, keep=2)
    checkpointing.save_checkpoint(str(tmp_path), 5, master, state, {"cursor": 9}, keep=2)
    m2, s2, meta = checkpointing.load_checkpoint(str(tmp_path), master, state)
    assert meta["step"] == 5 and meta["cursor"] == 9
    for a, b in zip(jax.tree_util.tree_leaves((master, state)), jax.tree_util.tree_leaves((m2, s2))):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    # flip one byte in the newest: detected by its CRC, the older one is used
    path = tmp_path / "checkpoints" / "step_000005" / "state.safetensors"
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF
    path.write_bytes(bytes(raw))
    _, _, meta = checkpointing.load_checkpoint(str(tmp_path), master, state)
    assert meta["step"] == 3
    checkpointing.save_checkpoint(str(tmp_path), 6, master, state, {"cursor": 1}, keep=2)   # keeps the newest 2
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000005", "step_000006"]


def test_config_validation_is_a_clear_error():
    with pytest.raises(ValueError, match="must be >= 1"):
        trainer.Config(prompts_per_step=0)
    with pytest.raises(ValueError, match="top_p"):
        trainer.Config(top_p=1.5)


def test_ppo_config_flags_and_validation():
    cfg, _ = cli.parse(trainer.Config, grpo.GRPOConfig, argv=["--ppo-epochs", "3", "--minibatches", "4"])
    assert (cfg.ppo_epochs, cfg.minibatches) == (3, 4)
    assert (trainer.Config().ppo_epochs, trainer.Config().minibatches) == (1, 1)
    for bad in (dict(ppo_epochs=0), dict(minibatches=0)):
        with pytest.raises(ValueError, match="ppo_epochs and minibatches must be >= 1"):
            trainer.Config(**bad)
    with pytest.raises(ValueError, match="must divide prompts_per_step"):  # 16 prompts into 3 minibatches
        trainer.Config(prompts_per_step=16, minibatches=3)


def test_split_batch_keeps_row_order():
    data = {"x": np.arange(10), "y": np.arange(10) * 2}
    parts = update.split_batch(data, 3, 2)  # 10 rows -> minibatches of 4, 3, 3 -> microbatches of <= 2
    assert [[len(mb["x"]) for mb in mini] for mini in parts] == [[2, 2], [2, 1], [2, 1]]
    assert np.array_equal(np.concatenate([mb["y"] for mini in parts for mb in mini]), data["y"])
    assert [[len(mb["x"]) for mb in mini] for mini in update.split_batch(data, 1, 4)] == [[4, 4, 2]]
    with pytest.raises(ValueError, match="minibatches"):
        update.split_batch(data, 11, 2)
    with pytest.raises(ValueError, match="row counts"):
        update.split_batch({"x": np.arange(3), "y": np.arange(4)}, 1, 2)


def test_the_microbatch_comes_from_the_memory_budget():
    """fit_microbatch: the rows that fit beside the trainer's state (memory.rows_for_budget), capped at
    MICROBATCH_MAX; a budget that cannot hold one row is a clear error, not an out-of-memory crash."""
    import memory
    import model
    import update
    qwen05 = model.ModelConfig(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
                               head_dim=64, intermediate_size=4864, max_seq_len=32768, rope_theta=1e6,
                               rms_norm_eps=1e-6, qkv_bias=True, tie_embeddings=True)
    state = memory.train_state_bytes(qwen05) / 2**30
    rows = update.fit_microbatch(qwen05, 1024, budget_gb=state + 8)
    assert 1 <= rows < update.MICROBATCH_MAX
    assert memory.train_state_bytes(qwen05) + memory.train_step_bytes(qwen05, rows, 1024) <= (state + 8) * 2**30
    assert memory.train_state_bytes(qwen05) + memory.train_step_bytes(qwen05, rows + 1, 1024) > (state + 8) * 2**30
    assert update.fit_microbatch(qwen05, 1024, budget_gb=state + 8, with_ref=True) <= rows  # pi_ref's copy
    with pytest.raises(ValueError, match="does not fit"):
        update.fit_microbatch(qwen05, 1024, budget_gb=state)
    tiny = model.ModelConfig(vocab_size=259, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                             head_dim=16, intermediate_size=128, max_seq_len=128, rope_theta=1e4, rms_norm_eps=1e-6,
                             qkv_bias=False, tie_embeddings=True, model_type="llama")
    assert update.fit_microbatch(tiny, 128, budget_gb=4) == update.MICROBATCH_MAX


@pytest.mark.parametrize("role", ["trainer", "inference_worker", "param_server", "verifier", "curate", "rejection_sample",
                                  "sft", "recipe"])
def test_every_role_prints_its_help(role, capsys):
    """`python ROLE.py --help` lists every flag with its docstring (a '%' in a docstring must not break
    argparse's help formatting)."""
    import importlib
    module = importlib.import_module(role)
    classes = {"trainer": (trainer.Config, grpo.GRPOConfig)}.get(role, (getattr(module, "Config", None)
                                                                        or getattr(module, "VerifierConfig"),))
    with pytest.raises(SystemExit) as stop:
        cli.parse(*classes, argv=["--help"])
    out = capsys.readouterr().out
    assert stop.value.code == 0
    for cls in classes:
        for name in cli.field_docs(cls):
            assert "--" + name.replace("_", "-") in out
    if role == "trainer":  # its help has a '%' ("80%% of the device's")
        assert "80% of the device" in " ".join(out.split())


def test_shaped_rewards_budget_each_turn_of_a_multi_turn_row():
    """trainer.shaped_rewards on a group of two episodes, --max-new-tokens (max_len) 5, L_cache 2: row 0
    has two model turns of 4 tokens (an observation between them), each within the budget, 8 in all;
    row 1 one turn of 5, exactly the budget. Per turn: row 0 is under L_max - L_cache = 3 by 1 token,
    (3 - 4) / 2 = -0.5; row 1, (3 - 5) / 2 = -1. Summed over turns row 0 would be 8 > 5: -1, the
    punishment of a cut row, although no turn was cut."""
    import types
    T = 20
    mask = np.zeros((2, T), np.float32)
    mask[0, 2:6] = 1; mask[0, 9:13] = 1
    mask[1, 2:7] = 1
    rollout = types.SimpleNamespace(rewards_G=np.array([1.0, 1.0], np.float32), mask_GT=mask,
                                    finished_G=np.array([True, False]))
    gcfg = grpo.GRPOConfig(group_size=2, max_len=5, overlong_buffer_len=2, overlong_filter=True)
    rewards_BG, keep_R = trainer.shaped_rewards([rollout], gcfg)
    np.testing.assert_allclose(rewards_BG, [[1.0 - 0.5, 1.0 - 1.0]])
    assert keep_R.tolist() == [True, False]  # row 1 used its whole budget and did not finish


def test_a_group_whose_only_failures_are_reward_errors_is_dropped_with_a_log_line():
    """Trainer.receive on a group of 4 whose reward function failed on 2 completions (status
    reward_error, no infra_error): the group gets the fate verifier_failed and one log line naming the
    status; nothing raises. The books, collector and the rollout's wire map are the real ones; the
    param server is a stand-in that returns the one rollout."""
    import collections
    import types
    import lifecycle
    import wire
    G, T = 4, 6
    item = wire.WorkItem(item_id="train/0|p0", prompt="p", group_size=G, seq_len=T, max_new_tokens=2,
                         min_version=0, lineage="a")
    statuses = ["passed", lifecycle.REWARD_ERROR, "failed", lifecycle.REWARD_ERROR]
    data = wire.Rollout(item_id=item.item_id, version=0, lineage="a", worker="w", prompt_len=2,
                        tokens_GT=np.ones((G, T), np.int32), logp_behav_GT=np.zeros((G, T), np.float32),
                        mask_GT=np.ones((G, T), np.float32), rewards_G=np.array([1, 0, 0, 0], np.float32),
                        finished_G=np.ones(G, bool), statuses=statuses).to_dict()
    fates, lines = [], []
    books = lifecycle.Books(0, 1, "a", lambda i, f: fates.append((i, f)))
    books.add(item)
    t = trainer.Trainer.__new__(trainer.Trainer)
    t.cfg = trainer.Config(max_verifier_failure_frac=0.9)
    t.collector = lifecycle.Collector(books, lambda i, v: (item, True))
    t.ps = types.SimpleNamespace(call=lambda msg, **kw: wire.Rollouts(rollouts=[data]))
    t.problem = types.SimpleNamespace(observe=lambda *a: None)
    t.verifier_window, t.step_programs = collections.deque(maxlen=3), [0, 0]
    t.lineage, t.auditor = "a", types.SimpleNamespace(check=lambda *a: "")  # audit.py: tests/test_untrusted_workers.py
    t.log = lines.append
    t.receive(wait_s=0.0)
    assert fates == [(item.item_id, lifecycle.VERIFIER_FAILED)]
    assert t.step_programs == [2, 4] and list(t.verifier_window) == [(2, 4)]
    assert lines == [f"{item.item_id}: 2 of 4 programs got verifier status reward_error: group dropped"]
    assert lifecycle.verifier_failure_text(["passed"] * 3) == "no verifier failure"
    assert lifecycle.verifier_failure_text([lifecycle.INFRA_ERROR, lifecycle.REWARD_ERROR, "passed"]) == (
        "1 of 3 programs got verifier status infra_error, 1 of 3 programs got verifier status reward_error")


def test_mismatch_histogram_counts_exact_zeros_and_bins_the_rest():
    """grpo.mismatch_histogram, the trainer's mismatch.jsonl line: only the selected tokens count; an exact
    match is a "zero", any other difference lands in its log10 bin (edges every 0.5 from -10 to 1)."""
    behav = np.array([[-1.0, -2.0, -3.0, -4.0]], np.float32)
    ours = behav + np.array([[0.0, 3e-3, 0.5, 7.0]], np.float32)
    exact = np.array([[True, True, True, False]])  # the 4th token is not compared
    line = grpo.mismatch_histogram(behav, ours, exact)
    assert line["tokens"] == 3 and line["zero"] == 1
    assert line["log10_edges"][0] == -10.0 and line["log10_edges"][-1] == 1.0 and len(line["counts"]) == 22
    # |3e-3|: log10 -2.52, bin [-3, -2.5) = 14; |0.5|: log10 -0.30, bin [-0.5, 0) = 19
    assert [i for i, c in enumerate(line["counts"]) if c] == [14, 19] and sum(line["counts"]) == 2


def test_lora_base_is_pushed_only_to_a_param_server_that_lacks_it():
    """Trainer.check_param_server under LoRA: the full base (version 0) goes to a server whose Pong does not
    hold our lineage's base (the first server; a restarted one that lost its state), never to one that kept
    it (a restart with its state dir, which weights_zmq.WeightStore persists: tests/test_weights_lora.py);
    adapter versions go whenever the server's newest is not ours. The pushes are recorded, not sent."""
    import types
    import lora
    import timeline
    import wire
    t = trainer.Trainer.__new__(trainer.Trainer)
    t.lcfg, t.lineage, t.ps_instance, t.log = lora.LoraConfig(4, 8.0, ("q_proj",)), "ours", None, lambda text: None
    t.timeline = timeline.Timeline("", "trainer")
    t.collector = types.SimpleNamespace(version=0, server_restarted=lambda: [])
    pushes, pongs = [], []
    t.collective = lambda command, payload: pushes.append((payload["version"], bool(payload.get("full"))))
    t.ps = types.SimpleNamespace(call=lambda msg, **kw: pongs.pop(0))

    def check(instance, info, step):
        t.collector.version = step
        pongs.append(wire.Pong("param_server", instance, info))
        pushes.clear()
        t.check_param_server()
        return list(pushes)

    fresh = {"version": -1, "lineage": "", "base": -1}
    assert check("s1", fresh, 0) == [(0, True)]                                     # the first push: the base
    assert check("s1", {"version": 0, "lineage": "ours", "base": 0}, 0) == []      # it holds it: nothing
    assert check("s1", {"version": 0, "lineage": "ours", "base": 0}, 1) == [(1, False)]  # a trained step: the adapter
    assert check("s2", {"version": 1, "lineage": "ours", "base": 0}, 3) == [(3, False)]  # restarted with its state
    assert check("s3", fresh, 3) == [(0, True), (3, False)]                        # restarted without: base, then adapter
    assert check("s4", {"version": 7, "lineage": "theirs", "base": 0}, 3) == [(0, True), (3, False)]  # another lineage's


def test_check_verifier_stops_the_run_only_on_a_full_window_over_the_limit():
    """lifecycle.check_verifier, which Trainer.receive calls after every reply: VerifierBroken (the trainer
    checkpoints and exits with EXIT_STOP_RUN) once a full window of groups has more than the allowed share
    of programs failed for the verifier's reasons, with the counts in its message; not before."""
    import collections
    import lifecycle
    window = collections.deque([(8, 8), (8, 8)], maxlen=3)
    lifecycle.check_verifier(window, 0.5)  # not full yet: no verdict on the verifier
    window.append((0, 8))
    lifecycle.check_verifier(window, 0.7)  # 16 of 24 = 0.67: within a limit of 0.7
    with pytest.raises(lifecycle.VerifierBroken, match=r"failed 16 of the last 24 programs .* 0\.6;"):
        lifecycle.check_verifier(window, 0.6)


def test_a_sigterm_during_an_evaluation_ends_it_without_numbers():
    """Trainer.evaluate when SIGTERM arrives (stop_requested) while held-out rollouts are still out: it stops
    waiting after that reply, returns no eval/* numbers from the part that came back, logs it, and forgets the
    pending items (late ones are not counted in the next evaluation). Without a SIGTERM the same loop waits
    for every item. The items, the param server's replies and the receive are stand-ins; the loop is real."""
    import types
    import lifecycle
    import timeline
    t = trainer.Trainer.__new__(trainer.Trainer)
    t.cfg = trainer.Config(eval_samples=2, eval_greedy=False, rollout_timeout_s=60)
    t.heldout = [types.SimpleNamespace(item_id=f"p{j}") for j in range(3)]
    t.timeline, t.stop_requested, lines = timeline.Timeline("", "trainer"), False, []
    t.collector = lifecycle.Collector(lifecycle.Books(0, 1, "a", lambda *a: None), None)
    t.item = lambda p, item_id, G, version, evaluate=False, temperature=None: wire_item(item_id)
    t.enqueue, t.log = lambda items: None, lines.append
    replies = []

    def receive(wait_s):  # one evaluation rollout per reply; the SIGTERM lands during the first
        item_id = next(iter(t.collector.eval_pending))
        t.collector.eval_pending.pop(item_id)
        t.collector.evals.append(types.SimpleNamespace(item_id=item_id, statuses=["passed"] * 2,
                                                       rewards_G=np.array([1.0, 0.0])))
        replies.append(item_id)
        t.stop_requested = stop_on_first
    t.receive = receive

    stop_on_first = True
    assert t.evaluate() == {} and len(replies) == 1
    assert lines == ["evaluation at step 0 abandoned for SIGTERM: 2 of 3 unanswered"] and not t.collector.eval_pending
    stop_on_first, t.stop_requested = False, False
    metrics = t.evaluate()
    assert len(replies) == 4 and metrics["eval/problems"] == 3 and metrics["eval/pass@1"] == 0.5


def wire_item(item_id):
    import wire
    return wire.WorkItem(item_id=item_id, prompt="p", group_size=2, seq_len=8, max_new_tokens=2,
                         min_version=0, lineage="a")
