"""End to end: 20 GRPO steps of our system (launch.sh: param server, verifier, 2 workers, trainer) vs
TRL's GRPOTrainer on this CPU, same model, task, reward, group size, batch, generation length and lr.

Run:  python bench/bench_e2e_trl.py                 # 20 steps each (~6 min on 2 cores)
      python bench/bench_e2e_trl.py --steps 5 --only trl

Shared settings (ours = launch.sh's default run with the DAPO dynamic sampling switched off, because
TRL has none, and a tiny evaluation, which is not counted):
  model       checkpoints/coldstart (Llama, 0.8M params, byte tokenizer: hf_io.ByteTokenizer)
  task        tasks.train_problems(0), completion format (prompts.model_prompt), stop at "\n"
  reward      verifier.py: the program prompts.assemble_program builds, run by the verifier's sandbox
              (ours: the verifier service; TRL: verifier.verify_batch in process, 2 executors)
  GRPO        16 prompts x 8 completions per step, 16 new tokens, temperature 1, lr 1e-4 constant, Adam,
              grad clip 1.0, k3 KL to the start policy with beta 0.2, clip 0.2/0.28, token-mean loss
              (TRL loss_type="dapo"), group-std advantages (TRL scale_rewards="group")
TRL's fast settings: gradient_checkpointing=False (its default is True), float32 weights (faster than
bf16 on this CPU), torch.set_num_threads(nproc), use_vllm=False (no vLLM on CPU), generation by
transformers generate with the KV cache.
Time: the training loop only: ours from the end of the step-0 evaluation to step N's metrics minus
step N's evaluation (metrics.jsonl time_s, wait/eval_s); TRL trainer.train(). Both whole-command times
are printed too. Reward: the mean training reward of the last 5 steps (reward/mean; TRL's "reward").
Ours runs with launch.sh's persistent compilation cache warm (a 2-step run fills a fresh one first;
its first step, which compiles, is reported as ours_cold_step1_s). With --repeats N the sides
alternate run by run and the medians are reported.

Prints `RESULT name=e2e_trl ours_s=.. peer_s=.. speedup=.. ours_reward=.. peer_reward=..`, or
`RESULT name=e2e_trl status=unavailable reason=..` when TRL cannot run here.
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

B, G, L, LR, BETA = 16, 8, 16, 1e-4, 0.2
WINDOW = 5


def free_base_port() -> int:
    """A port p with p and p+2 free (launch.sh: param server on PORT, verifier on PORT+2)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p > 60000:
            continue
        ok = True
        for q in (p, p + 2):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", q))
                except OSError:
                    ok = False
        if ok:
            return p
    raise RuntimeError("no free ports")


def stop_trainer(run_dir: str, p, wait_s: float = 90.0) -> None:
    """SIGTERM the trainer alone (a preemption notice: it finishes its step, checkpoints, exits 143);
    wait for its "stopped by SIGTERM" line, so the run leaves a checkpoint (launch.sh's own SIGTERM
    gives every role 1 s before SIGKILL, too short for a checkpoint)."""
    try:
        with open(os.path.join(run_dir, "pids", "trainer")) as f:
            pid = int(f.read().strip())
        os.killpg(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + wait_s
    log = os.path.join(run_dir, "trainer.log")
    while time.monotonic() < deadline and p.poll() is None:
        try:
            with open(log) as f:
                if "stopped by SIGTERM" in f.read():
                    return
        except OSError:
            pass
        time.sleep(0.5)


def log_tail(path: str, lines: int = 40) -> str:
    """The last lines of a log (launch.sh's own output names the role that stopped a run and shows
    that role's last lines), or a note that there is none."""
    try:
        with open(path, errors="replace") as f:
            text = f.read().splitlines()[-lines:]
    except OSError as e:
        return f"(no log {path}: {e})"
    return "\n".join(f"  | {line}" for line in text) or f"(the log {path} is empty)"


def run_launch(run_dir: str, steps: int, env_extra: dict, timeout_s: float, stop_after_s: float | None = None) -> float:
    """bash launch.sh in its own process group; returns wall seconds (until the stop was asked, for a
    stopped run). stop_after_s: then SIGTERM the trainer (it checkpoints), then launch.sh's group.
    Every role runs with this interpreter (PYTHON=sys.executable: launch.sh's own default is the first
    python3 on PATH, which may be another one, without our packages). A launch.sh that ends by itself
    with a failure gets the tail of its log ({run_dir}.log) printed."""
    env = {**os.environ, "PYTHON": sys.executable, "RUN_DIR": run_dir, "STEPS": str(steps), "PORT": str(free_base_port()),
           "EVAL": "--heldout 8 --eval-every 0", "RECIPE": f"--kl-beta {BETA} --lr {LR}",
           "TRAINER_ARGS": "--eval-samples 1 --no-eval-greedy --checkpoint-every 1000", **env_extra}
    t0 = time.monotonic()
    log = open(run_dir + ".log", "w")
    p = subprocess.Popen(["bash", "launch.sh"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    wall = None
    try:
        p.wait(timeout=stop_after_s if stop_after_s else timeout_s)
    except subprocess.TimeoutExpired:
        wall = time.monotonic() - t0
        if stop_after_s:
            stop_trainer(run_dir, p)
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        log.close()
    if wall is None and p.returncode != 0:
        print(f"launch.sh ({run_dir}) exited with status {p.returncode}; the end of {run_dir}.log:\n"
              f"{log_tail(run_dir + '.log')}", flush=True)
    return wall if wall is not None else time.monotonic() - t0


def metrics(run_dir: str) -> list:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def ours(steps: int, tmp: str) -> dict:
    # launch.sh keeps JAX's compiled programs in a persistent cache: a user's second run (or a restarted
    # role) does not compile. A 2-step run fills a fresh cache first; its first step shows the cold cost.
    # Every repetition shares the cache (in tmp's parent); only the first warms it.
    cache_dir = os.path.join(os.path.dirname(tmp), "jax-cache")
    cache = {"JAX_COMPILATION_CACHE_DIR": cache_dir, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_CACHE": ""}
    os.makedirs(tmp, exist_ok=True)
    warm_dir = os.path.join(os.path.dirname(tmp), "warm-up")
    if not os.path.isdir(cache_dir):
        run_launch(warm_dir, 2, cache, timeout_s=600)
    cold = {r["step"]: r for r in metrics(warm_dir)}.get(1, {}).get("time/step_s", float("nan"))
    print(f"ours: warm-up run (2 steps, fills the compilation cache): first step {cold:.2f} s", flush=True)
    run_dir = os.path.join(tmp, "ours")
    total = run_launch(run_dir, steps, cache, timeout_s=900)
    rows = metrics(run_dir)
    by = {r["step"]: r for r in rows}
    if steps not in by:
        raise RuntimeError(f"our run did not reach step {steps}; the end of {run_dir}.log:\n{log_tail(run_dir + '.log')}")
    start = by[0]["time_s"]
    train_s = by[steps]["time_s"] - start - by[steps].get("wait/eval_s", 0.0)
    rewards = [by[s]["reward/mean"] for s in range(1, steps + 1) if "reward/mean" in by[s]]
    return {"s": train_s, "total_s": total, "cold_step1_s": cold, "step1_s": by[1]["time/step_s"], "reward": sum(rewards[-WINDOW:]) / len(rewards[-WINDOW:]),
            "reward_first": rewards[0], "rewards": rewards}


def byte_tokenizer(out_dir: str, eos: str):
    """hf_io.ByteTokenizer as a transformers tokenizer: byte b is id b, pad 256, bos 257; eos = the
    task's stop string (the worker samples with that as eos too)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    # GPT-2's byte -> printable character map, which the ByteLevel pre-tokenizer applies
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    mapping = {b: chr(c) for b, c in zip(bs, cs)}
    assert set(mapping.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert len(eos.encode()) == 1, eos
    vocab = {mapping[b]: b for b in range(256)}
    vocab["<pad>"], vocab["<bos>"], vocab["<eos>"] = 256, 257, 258
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    t = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")
    t.add_special_tokens({"additional_special_tokens": ["<pad>", "<bos>", "<eos>"]})
    import hf_io
    text = "def f(x):\n    return 3 * x - 24\n"
    assert t(text, add_special_tokens=False)["input_ids"] == hf_io.ByteTokenizer().encode(text)
    t.eos_token = mapping[eos.encode()[0]]  # stop at the task's (one-byte) stop string, as our worker does
    assert t.eos_token_id == eos.encode()[0], t.eos_token_id
    t.save_pretrained(out_dir)
    return t


def trl_run(steps: int, tmp: str) -> dict:
    t_all = time.monotonic()
    import torch
    import trl
    import transformers
    from datasets import Dataset

    import prompts
    import tasks
    import verifier

    nproc = len(os.sched_getaffinity(0))
    stream = tasks.train_problems(0)
    problems = stream.batch(0, B * steps)
    stops = {tuple(prompts.stop_strings(p, "completion")) for p in problems}
    assert stops == {("\n",)}, stops
    tok = byte_tokenizer(os.path.join(tmp, "tok"), "\n")
    ds = Dataset.from_list([{"prompt": prompts.model_prompt(p, "completion"), "prefix": prompts.program_prefix(p, "completion"),
                             "tests": p.tests} for p in problems])
    pool = verifier.default_pool(2)

    def reward(prompts_, completions, prefix, tests, **_):
        jobs = [{"kind": "assert", "program": prompts.assemble_program("completion", pre, c, ("\n",)),
                 "tests": t, "timeout_s": 5.0} for c, pre, t in zip(completions, prefix, tests)]
        return [float(v.reward) for v in verifier.verify_batch(jobs, workers=2)]

    def reward_fn(prompts, completions, prefix, tests, **kw):
        return reward(prompts, completions, prefix, tests, **kw)
    reward_fn.__name__ = "verifier"

    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(ROOT, "checkpoints/coldstart"),
                                                              dtype=torch.float32)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = None
    # torch's threads: nproc (its usual setting) or 1, whichever runs a step's generate faster here
    # (on a shared, loaded machine nproc threads can be several times slower)
    import hf_io
    ids = [hf_io.ByteTokenizer().encode(x) for x in ds["prompt"][:B]]
    n = max(map(len, ids))
    inp = torch.tensor([[tok.pad_token_id] * (n - len(i)) + i for i in ids for _ in range(G)])
    probe = {}
    for threads in sorted({nproc, 1}, reverse=True):
        torch.set_num_threads(threads)
        with torch.no_grad():
            model.generate(inp, attention_mask=(inp != tok.pad_token_id).long(), max_new_tokens=L, do_sample=True)
            t0 = time.monotonic()
            model.generate(inp, attention_mask=(inp != tok.pad_token_id).long(), max_new_tokens=L, do_sample=True)
            probe[threads] = time.monotonic() - t0
    threads = min(probe, key=probe.get)
    torch.set_num_threads(threads)
    print("TRL torch threads: generate " + ", ".join(f"{v:.2f} s with {k}" for k, v in probe.items())
          + f": using {threads}", flush=True)
    cfg = trl.GRPOConfig(
        output_dir=os.path.join(tmp, "trl"), max_steps=steps, per_device_train_batch_size=B * G,
        gradient_accumulation_steps=1, num_generations=G, max_completion_length=L,
        learning_rate=LR, lr_scheduler_type="constant", beta=BETA, epsilon=0.2, epsilon_high=0.28,
        loss_type="dapo", scale_rewards="group", temperature=1.0, top_p=1.0, top_k=0,
        gradient_checkpointing=False, use_cpu=True, bf16=False, logging_steps=1, save_strategy="no",
        report_to="none", seed=0, max_grad_norm=1.0, dataloader_num_workers=0, disable_dropout=True)
    tr = trl.GRPOTrainer(model=model, reward_funcs=reward_fn, args=cfg, train_dataset=ds, processing_class=tok)
    t0 = time.monotonic()
    tr.train()
    train_s = time.monotonic() - t0
    logs = [h for h in tr.state.log_history if "reward" in h]
    rewards = [h["reward"] for h in logs]
    print("TRL rewards per step:", " ".join(f"{r:.3f}" for r in rewards), flush=True)
    return {"s": train_s, "total_s": time.monotonic() - t_all, "reward": sum(rewards[-WINDOW:]) / len(rewards[-WINDOW:]),
            "reward_first": rewards[0], "trl": trl.__version__, "threads": threads, "steps_done": len(rewards)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--only", choices=["ours", "trl"], default=None)
    ap.add_argument("--trl-timeout", type=int, default=900, help="seconds TRL's process may take")
    ap.add_argument("--repeats", type=int, default=1, help="runs per side, alternating; medians are reported")
    ap.add_argument("--trl-child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trl_child:  # TRL in its own process: its imports and threads do not touch ours
        r = trl_run(args.steps, args.trl_child)
        print("TRLRESULT " + json.dumps(r), flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        runs = {"ours": [], "trl": []}
        for rep in range(args.repeats):  # the sides alternate, run by run
            if args.only != "trl":
                o = ours(args.steps, os.path.join(tmp, f"ours{rep}"))
                runs["ours"].append(o)
                print(f"ours: {args.steps} steps, train loop {o['s']:.1f} s (whole launch.sh {o['total_s']:.1f} s); "
                      f"reward first {o['reward_first']:.3f}, last {WINDOW} steps {o['reward']:.3f}", flush=True)
            if args.only != "ours":
                t = trl_side(args, tmp, runs["ours"])
                if t is None:
                    return
                runs["trl"].append(t)
                print(f"TRL {t['trl']}: {t['steps_done']} steps, train() {t['s']:.1f} s (whole process "
                      f"{t['total_s']:.1f} s); reward first {t['reward_first']:.3f}, last {WINDOW} steps "
                      f"{t['reward']:.3f}", flush=True)
        if runs["ours"] and runs["trl"]:
            med = lambda side, k: statistics.median(r[k] for r in runs[side])  # noqa: E731
            o = {k: med("ours", k) for k in ("s", "total_s", "reward", "reward_first", "cold_step1_s", "step1_s")}
            t = {k: med("trl", k) for k in ("s", "total_s", "reward", "reward_first")}
            print(f"RESULT name=e2e_trl steps={args.steps} prompts={B} group={G} new_tokens={L} "
                  f"trl={runs['trl'][0]['trl']} repeats={args.repeats} "
                  f"ours_s={o['s']:.1f} peer_s={t['s']:.1f} speedup={t['s'] / o['s']:.3f} "
                  f"torch_threads={runs['trl'][0]['threads']} ours_total_s={o['total_s']:.1f} "
                  f"peer_total_s={t['total_s']:.1f} ours_step1_s={o['step1_s']:.2f} "
                  f"ours_cold_step1_s={o['cold_step1_s']:.2f} "
                  f"ours_reward={o['reward']:.4f} peer_reward={t['reward']:.4f} "
                  f"ours_reward_first={o['reward_first']:.4f} peer_reward_first={t['reward_first']:.4f} "
                  f"reward_window={WINDOW}", flush=True)


def trl_side(args, tmp: str, ours_runs: list) -> dict | None:
    """One TRL run in its own process; None (after printing an `unavailable` RESULT) if it cannot run."""
    t0 = time.monotonic()
    try:
        import trl  # noqa: F401
    except ImportError as e:
        print(f"RESULT name=e2e_trl status=unavailable reason=trl_not_installed:{type(e).__name__}")
        return None
    try:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--steps", str(args.steps),
                              "--trl-child", tmp], cwd=ROOT, capture_output=True, text=True,
                             timeout=args.trl_timeout, start_new_session=True)
    except subprocess.TimeoutExpired as e:
        sys.stdout.write((e.stdout or b"").decode(errors="replace")[-3000:] if isinstance(e.stdout, bytes) else (e.stdout or "")[-3000:])
        o = ours_runs[-1] if ours_runs else {}
        print(f"RESULT name=e2e_trl status=unavailable reason=TRL_{args.steps}_steps_did_not_finish_in_"
              f"{args.trl_timeout}s_here ours_s={o.get('s', float('nan')):.1f} "
              f"ours_reward={o.get('reward', float('nan')):.4f} peer_s_over={args.trl_timeout}", flush=True)
        return None
    sys.stdout.write(out.stdout[-3000:])
    line = [x for x in out.stdout.splitlines() if x.startswith("TRLRESULT ")]
    if not line:
        reason = (out.stderr.strip().splitlines() or ["no output"])[-1].replace(" ", "_")[:120]
        sys.stderr.write(out.stderr[-4000:])
        print(f"RESULT name=e2e_trl status=unavailable reason={reason}")
        return None
    t = json.loads(line[0].split(" ", 1)[1])
    t["total_s"] = time.monotonic() - t0
    return t


if __name__ == "__main__":
    main()
