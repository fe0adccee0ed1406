"""The R1 recipe in one command: cold start, GRPO, rejection sampling, SFT, final GRPO.

    STAGES=r1 bash launch.sh                               # the whole recipe on the embedded task
    STAGES=coldstart,grpo STAGE_ARGS="--grpo-steps 250" bash launch.sh   # plain GRPO, evaluated alike
    STAGES=r1 STAGE_ARGS="--sft-from base" RUN_DIR=runs/r1 bash launch.sh  # SFT from the cold start
    python recipe.py --run-dir runs/r1 --stages r1         # the same without launch.sh's variables

DeepSeek-R1 (DeepSeek-AI 2025, section 2.3) is four stages, not one RL run; docs/algorithm.md says why
each, and what each added here. The stages, in order, each in $RUN_DIR/<stage>/:
  coldstart   the starting checkpoint: --model copied (the committed embedded cold start by default),
              or, with --coldstart warmup, made again by warmup.py's two supervised stages
  grpo        GRPO from the cold start: `bash launch.sh` with RUN_DIR=$RUN_DIR/grpo, STEPS=--grpo-steps
              (every launch.sh variable you set, RECIPE, EVAL, WORKERS..., applies to it)
  rejection   rejection_sample.py on the GRPO policy: k samples of each training problem, the
              verified-right ones kept (at most --rs-keep per problem), written as SFT rows
  sft         sft.py on those rows, from the GRPO policy (--sft-from policy) or from the cold start
              (--sft-from base: R1 retrains its base model on the rejection samples)
  grpo_final  GRPO again from the SFT checkpoint, --final-steps steps
--stages is "r1" (all five) or a comma list that is a prefix of that order ("coldstart,grpo" is plain GRPO).

Resumable stage by stage: a stage writes $RUN_DIR/<stage>/done.json last, and a stage that has one is
skipped. A GRPO stage stopped part way continues from its last checkpoint (launch.sh RESUME=1); a
stage's checkpoint is written beside and renamed into place, so it is whole or absent. SIGTERM stops the
running stage the way launch.sh stops a run (the trainer checkpoints first) and exits 143.

Every checkpoint is evaluated the same way, in this process: 8 samples (temperature 1) and one greedy
completion of each held-out problem, built, sampled and verified as the workers do it
(curate.sample_and_verify), with one fixed sampling seed, so the same checkpoint gets the same numbers in
every run. Held-out: the first --heldout of the embedded task's held-out problems (launch.sh's), or a
dataset's held-out split; unseen (embedded only): the --unseen held-out problems after those, which no
run trains or evaluates on. At the end: one summary line, and the table (also $RUN_DIR/recipe.md and
recipe.json), with each stage's sampled completions, so two recipes compare at equal sampling.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import checkpointing
import cli
import curate
import grpo_config
import objectives
import rejection_sample
import sft
import tasks
import trainer

R1 = ("coldstart", "grpo", "rejection", "sft", "grpo_final")
EVAL_SEED = 1234  # the evaluation's sampling seed: fixed, so a checkpoint's numbers do not depend on the run
HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Config:
    """The recipe's settings (launch.sh passes its variables as these flags)."""
    run_dir: str = ""
    """where every stage's folder goes (required)"""
    stages: str = "r1"
    """"r1" (all five stages) or a comma list that is a prefix of coldstart,grpo,rejection,sft,grpo_final"""
    model: str = "checkpoints/coldstart"
    """the cold-start checkpoint the recipe starts from"""
    coldstart: str = "copy"
    """copy: --model is the cold start; warmup: make the embedded cold start again with warmup.py"""
    data: str = ""
    """JSONL problems (launch.sh DATA); "" = the embedded task"""
    seed: int = 0
    """every stage's seed (launch.sh SEED)"""
    prompt_format: str = ""
    """"completion" or "chat"; "" = chat when the checkpoint has a chat template (launch.sh PROMPT_FORMAT)"""
    max_new_tokens: int = trainer.Config.max_new_tokens
    """longest completion, in every stage (given to the GRPO stages' trainer too)"""
    heldout: int = 256
    """held-out problems: evaluated at every stage, never sampled for training (given to the trainer too)"""
    unseen: int = 303
    """embedded task only: the next held-out problems, evaluated at every stage and nowhere else; 0 = none"""
    grpo_steps: int = 125
    """steps of the first GRPO stage"""
    final_steps: int = 94
    """steps of the final GRPO stage"""
    rs_problems: int = 512
    """embedded task only: distinct training problems the rejection stage samples"""
    rs_k: int = 8
    """samples per problem in the rejection stage"""
    rs_keep: int = 2
    """distinct verified-right completions kept per problem"""
    rs_pick: str = "random"
    """random or shortest (rejection_sample.py)"""
    sft_from: str = "policy"
    """policy: fine-tune the GRPO policy on the rejection samples; base: the cold start"""
    sft_epochs: float = 3.0
    """passes over the rejection samples"""
    sft_lr: float = 3e-4
    """the SFT stage's peak learning rate"""

    def __post_init__(self):
        if not self.run_dir:
            raise ValueError("--run-dir is required")
        if self.coldstart not in ("copy", "warmup") or self.sft_from not in ("policy", "base"):
            raise ValueError("--coldstart is copy or warmup, --sft-from policy or base")
        if self.coldstart == "warmup" and self.data:
            raise ValueError("--coldstart warmup makes the embedded task's cold start: not with --data")
        if self.rs_pick not in rejection_sample.PICKS:
            raise ValueError(f"--rs-pick must be one of {rejection_sample.PICKS}")
        if min(self.grpo_steps, self.final_steps, self.rs_problems, self.rs_k, self.rs_keep, self.heldout) < 1:
            raise ValueError("--grpo-steps, --final-steps, --rs-problems, --rs-k, --rs-keep, --heldout must be >= 1")
        self.stage_list()

    def stage_list(self) -> tuple:
        names = R1 if self.stages == "r1" else tuple(s.strip() for s in self.stages.split(",") if s.strip())
        if not names or names != R1[:len(names)]:
            raise ValueError(f"--stages {self.stages!r}: 'r1' or a prefix of {','.join(R1)}")
        return names


# ----------------------------------------------------------------------------- evaluation

def evaluate(ckpt: str, cfg: Config, log=print) -> dict:
    """{"heldout": {...}, "unseen": {...}} (unseen on the embedded task only): pass@1 and pass@8 from 8
    samples, greedy pass@1, the problems, and verdicts lost to infrastructure (left out)."""
    policy = curate.load_policy(ckpt, cfg.prompt_format)
    if cfg.data:
        train, held, _ = curate.dataset_problems(cfg.data, cfg.heldout)
        sets, every = {"heldout": held}, train + held
    else:
        every = tasks.heldout_problems(cfg.heldout + cfg.unseen)
        sets = {"heldout": every[:cfg.heldout], **({"unseen": every[cfg.heldout:]} if cfg.unseen else {})}
    T = curate.seq_len(policy, every, cfg.max_new_tokens, bool(cfg.data))
    quiet = lambda text: None  # noqa: E731
    out = {}
    for name, problems in sets.items():
        runs = {n: [curate.tally("", p.item_id, [(ok, s) for _, ok, s in got]) for p, got in zip(problems,
                    curate.sample_and_verify(policy, problems, n, T, EVAL_SEED, temp, cfg.max_new_tokens, log=quiet))
                    if got is not None] for n, temp in ((8, 1.0), (1, 0.0))}
        full = [r for r in runs[8] if r.k == 8]
        out[name] = {"pass@1": _mean([r.rate for r in runs[8] if r.k]),
                     "pass@8": _mean([objectives.pass_at_k(8, r.passed, 8) for r in full]),
                     "greedy": _mean([r.rate for r in runs[1] if r.k]), "problems": len(problems),
                     "infra_errors": sum(r.infra_errors for r in runs[8] + runs[1])}
        log(f"recipe: {ckpt}: {name} ({len(problems)} problems) pass@1 {out[name]['pass@1']:.3f}  "
            f"pass@8 {out[name]['pass@8']:.3f}  greedy {out[name]['greedy']:.3f}")
    return out


def _mean(xs: list) -> float:
    return round(sum(xs) / len(xs), 4) if xs else float("nan")


# ----------------------------------------------------------------------------- the stages

_child = None  # the running launch.sh, which SIGTERM is passed on to


def _on_sigterm(signum, frame):
    if _child is not None and _child.poll() is None:
        _child.send_signal(signal.SIGTERM)  # launch.sh stops its roles; the trainer checkpoints first
    raise SystemExit(143)


def run_grpo(stage_dir: str, model_dir: str, steps: int, cfg: Config) -> str:
    """`bash launch.sh` in stage_dir from model_dir; RESUME=1 when a checkpoint is there. Returns final/."""
    global _child
    resume = bool(checkpointing.list_checkpoints(stage_dir))
    if os.path.isdir(stage_dir) and not resume:  # stopped before its first checkpoint: start it again
        shutil.rmtree(stage_dir)
    # The trainer holds out --heldout rows of a dataset (so rejection sampling never samples them); on the
    # embedded task the held-out problems are apart anyway, and the trainer's own evaluation is cut to a
    # glance (32 problems, at the start and the end): this file evaluates every stage itself.
    extra = f"--max-new-tokens {cfg.max_new_tokens} " + (f"--heldout {cfg.heldout}" if cfg.data else
                                                          "--heldout 32 --eval-every 0 --no-eval-greedy")
    env = {k: v for k, v in os.environ.items() if k not in ("STAGES", "RESUME")}
    env.update(RUN_DIR=stage_dir, MODEL=model_dir, STEPS=str(steps), SEED=str(cfg.seed), DATA=cfg.data,
               PROMPT_FORMAT=cfg.prompt_format, TRAINER_ARGS=f"{env.get('TRAINER_ARGS', '')} {extra}".strip(),
               **({"RESUME": "1"} if resume else {}))
    _child = subprocess.Popen(["bash", os.path.join(HERE, "launch.sh")], env=env)
    try:
        code = _child.wait()
    finally:
        if _child.poll() is None:  # SIGTERM arrived: let launch.sh finish stopping its roles
            _child.wait()
        _child = None
    final = os.path.join(stage_dir, "final")
    if code != 0 or not os.path.isfile(os.path.join(final, "config.json")):
        raise RuntimeError(f"stage {os.path.basename(stage_dir)}: launch.sh exited {code} without final/; "
                           f"its logs are in {stage_dir}")
    return final


def grpo_samples(stage_dir: str) -> int:
    """Completions a GRPO stage sampled for training: its ledger's prompts (every fate but never sampled
    for being too long) times the group size on the trainer's command line."""
    fates = [json.loads(line)["fate"] for line in open(os.path.join(stage_dir, "ledger.jsonl"))]
    line = next(l for l in open(os.path.join(stage_dir, "commands.sh")) if "trainer.py" in l)
    sizes = re.findall(r"--group-size[ =](\d+)", line)
    G = int(sizes[-1]) if sizes else grpo_config.GRPOConfig.group_size
    return G * sum(f != "skipped_too_long" for f in fates)


def copy_checkpoint(src: str, dst: str) -> str:
    tmp = dst + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    os.replace(tmp, dst)
    return dst


def make_coldstart(stage_dir: str, cfg: Config) -> str:
    final = os.path.join(stage_dir, "final")
    if cfg.coldstart == "copy":
        return copy_checkpoint(cfg.model, final)
    tmp = final + ".tmp"  # warmup.py's docstring: the committed checkpoint's two stages
    for args in ([], ["--init", tmp, "--first-problem", "25600", "--steps", "125", "--lr", "1e-3"]):
        subprocess.run([sys.executable, os.path.join(HERE, "warmup.py"), "--out", tmp, "--seed", str(cfg.seed),
                        *args], check=True)
    os.replace(tmp, final)
    return final


def run_stage(name: str, cfg: Config, done: dict, log=print) -> dict:
    """Make one stage's output from the stages before it; returns its record (done.json)."""
    d, t0 = os.path.join(cfg.run_dir, name), time.time()
    os.makedirs(cfg.run_dir, exist_ok=True)
    record = {"stage": name, "samples": 0}
    if name == "coldstart":
        record["checkpoint"] = (os.path.join(d, "final") if os.path.isfile(os.path.join(d, "final", "config.json"))
                                else make_coldstart(d, cfg))
    elif name in ("grpo", "grpo_final"):
        start = done["coldstart" if name == "grpo" else "sft"]["checkpoint"]
        steps = cfg.grpo_steps if name == "grpo" else cfg.final_steps
        final = os.path.join(d, "final")
        record["checkpoint"] = final if os.path.isfile(os.path.join(final, "config.json")) else run_grpo(d, start, steps, cfg)
        record["samples"], record["steps"] = grpo_samples(d), steps
    elif name == "rejection":
        if not os.path.isfile(os.path.join(d, "report.json")):
            rejection_sample.main(rejection_sample.Config(
                model=done["grpo"]["checkpoint"], out=d, data=cfg.data, heldout=cfg.heldout, problems=cfg.rs_problems,
                k=cfg.rs_k, keep=cfg.rs_keep, pick=cfg.rs_pick, seed=cfg.seed, prompt_format=cfg.prompt_format,
                max_new_tokens=cfg.max_new_tokens), log=log)
        report = json.load(open(os.path.join(d, "report.json")))
        record.update(samples=report["samples"], rows=report["rows"], rs_pass_rate=report["mean_pass_rate"] or 0.0)
    elif name == "sft":
        start = done["grpo" if cfg.sft_from == "policy" else "coldstart"]["checkpoint"]
        final, rows = os.path.join(d, "final"), done["rejection"]["rows"]
        if rows == 0:  # nothing verified right: there is nothing to fine-tune on
            log(f"recipe: the rejection stage kept no rows; the sft stage is {start} unchanged")
            record["checkpoint"] = start
        elif not os.path.isfile(os.path.join(final, "config.json")):
            os.makedirs(d, exist_ok=True)
            sft.main(sft.Config(model=start, data=os.path.join(cfg.run_dir, "rejection", "sft.jsonl"), out=final,
                                epochs=cfg.sft_epochs, lr=cfg.sft_lr, seed=cfg.seed, prompt_format=cfg.prompt_format),
                     log=log)
        record.setdefault("checkpoint", final)
        record["from"] = cfg.sft_from
    if "checkpoint" in record and name != "rejection":
        record["eval"] = evaluate(record["checkpoint"], cfg, log)
    record["seconds"] = round(time.time() - t0, 1)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "done.json.tmp"), "w") as f:
        json.dump(record, f, indent=1)
    os.replace(os.path.join(d, "done.json.tmp"), os.path.join(d, "done.json"))
    return record


# ----------------------------------------------------------------------------- the table

def table(records: list) -> str:
    """One markdown row per stage: held-out and unseen pass@1 / pass@8 / greedy, sampled completions."""
    sets = [s for s in ("heldout", "unseen") if any(s in r.get("eval", {}) for r in records)]
    head = ["stage"] + [f"{s} {m}" for s in sets for m in ("pass@1", "pass@8", "greedy")] + \
           ["sampled completions (total)", "seconds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    total = 0
    for r in records:
        total += r["samples"]
        cells = [r["stage"] + (f" (from {r['from']})" if "from" in r else "")]
        for s in sets:
            e = r.get("eval", {}).get(s)
            cells += [f"{e[m]:.3f}" for m in ("pass@1", "pass@8", "greedy")] if e else ["", "", ""]
        if "rows" in r:  # the rejection stage evaluates nothing: its training pass rate and rows instead
            cells[1:4] = [f"training pass rate {r['rs_pass_rate']:.3f}", f"{r['rows']} rows kept", ""]
        cells += [f"{r['samples']:,} ({total:,})", f"{r['seconds']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(records: list) -> str:
    """One line: each evaluated stage's numbers, in order."""
    parts = []
    for s in ("heldout", "unseen"):
        for m in ("pass@1", "pass@8", "greedy"):
            vals = [f"{r['stage']} {r['eval'][s][m]:.3f}" for r in records if s in r.get("eval", {})]
            if vals:
                parts.append(f"{s} {m}: " + " -> ".join(vals))
    return "recipe: " + "; ".join(parts) + f"; {sum(r['samples'] for r in records):,} completions sampled"


def main(cfg: Config, log=print) -> list:
    signal.signal(signal.SIGTERM, _on_sigterm)
    done = {}
    for name in cfg.stage_list():
        path = os.path.join(cfg.run_dir, name, "done.json")
        if os.path.isfile(path):
            done[name] = json.load(open(path))
            log(f"recipe: stage {name} is done ({path}): skipped")
            continue
        log(f"recipe: stage {name} ...")
        done[name] = run_stage(name, cfg, done, log)
    records = list(done.values())
    text = table(records)
    with open(os.path.join(cfg.run_dir, "recipe.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(cfg.run_dir, "recipe.json"), "w") as f:
        json.dump({"settings": dataclasses.asdict(cfg), "stages": records}, f, indent=1)
    log(text)
    log(summary(records))
    return records


if __name__ == "__main__":
    config = cli.parse(Config, description=__doc__.split("\n\n")[0])
    try:
        main(config)
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"recipe.py: error: {e}")
