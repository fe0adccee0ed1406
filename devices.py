"""Which chips each role runs on (the plan), and a check at start that it got them (no silent fallback).

    python devices.py --accelerator tpu --chips 8       # what launch.sh does: print the placement
    python devices.py --accelerator gpu --chips 1 --workers 2

The plan (pure, no jax; launch.sh calls this file once and starts exactly the lines it builds from it):

  * cpu (the default where no accelerator is found): every role on the CPU, 2 workers, as always.
  * tpu: the trainer takes TRAINER_CHIPS chips (default half), each worker WORKER_CHIPS chips (default
    1) of the rest; a TPU chip serves one process, so it is never shared. Each role is its own one-process
    libtpu "cluster" on its chips: TPU_VISIBLE_CHIPS, TPU_CHIPS_PER_PROCESS_BOUNDS (the chips' shape),
    TPU_PROCESS_BOUNDS=1,1,1, its own TPU_PROCESS_PORT / TPU_PROCESS_ADDRESSES, CLOUD_TPU_TASK_ID=0 and
    ALLOW_MULTIPLE_LIBTPU_LOAD. Sources: the JAX team's recipe for several processes on one Cloud TPU
    VM (gist.github.com/skye/f82ba45d2445bb19d53545538754f9a3, "Non-communicating processes"); the same
    variables in vllm-project/tpu-inference (tpu_worker.py `_setup_dp_chip_isolation`,
    examples/run_mpmd_toy.sh: two JAX processes on chips 0,1 and 2,3 of one host); JAX's own CI runs
    one test process per chip with TPU_VISIBLE_CHIPS and ALLOW_MULTIPLE_LIBTPU_LOAD
    (jax-ml/jax build/parallel_accelerator_execute.sh, ci/run_bazel_test_tpu.sh).
    A trainer across TPU hosts (--multihost-trainer: launch.sh's TRAINER_HOSTS > 1 or
    TRAINER_COORDINATOR=auto) is the exception: one process of a slice-wide JAX program, it takes every
    chip of its host and gets none of those variables (they would make each host a cluster of its own,
    and libtpu could not form the slice), so no worker can share its host.
  * gpu: CUDA_VISIBLE_DEVICES, the same split. With too few GPUs for a worker of its own (one GPU)
    the workers share the trainer's GPU(s). Every GPU role gets XLA_PYTHON_CLIENT_MEM_FRACTION, sized
    so the roles on one GPU fit together: JAX preallocates 75% of a GPU per process otherwise ("GPU
    memory allocation", docs.jax.dev: "Running multiple JAX processes concurrently ... use
    XLA_PYTHON_CLIENT_MEM_FRACTION to give each process an appropriate amount of memory").
  * The parameter server and the verifier never touch an accelerator: JAX_PLATFORMS=cpu (and no GPU).
  * A jax role's line also names its platform (RLAX_ACCELERATOR) and chip count (RLAX_CHIPS) for
    `check`, and sets JAX_PLATFORMS=tpu,cpu or cuda,cpu: the accelerator is JAX's default backend, the
    CPU stays available for host-side arrays. (A TPU backend that cannot start then raises at once;
    a missing CUDA plugin leaves JAX on the CPU, which `check` catches.)

`check(role)` is the first thing trainer.py and inference_worker.py do: log the devices JAX gave the
role, and stop it (exit status EXIT_MISPLACED, which stops the whole run under launch.sh) when it was
placed on an accelerator and JAX found none, or not the chips it was given. A CPU sampler beside an
accelerator trainer would quietly break bitwise sampler/trainer parity.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

import cli

PLATFORMS = ("cpu", "tpu", "gpu")
EXIT_MISPLACED = 3  # = trainer.EXIT_STOP_RUN: launch.sh stops the run instead of restarting the role
# A TPU process's chips must form a rectangle of the host's chip grid (TPU_CHIPS_PER_PROCESS_BOUNDS,
# x,y,z): 1 chip, 2 in a row, a 2x2 block (a v4-8 or v5p-8 host), the whole 2x4 v5e-8 / v6e-8 host.
TPU_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}
JAX_PLATFORM = {"cpu": "cpu", "tpu": "tpu,cpu", "gpu": "cuda,cpu"}  # what JAX_PLATFORMS says per platform
TRAINER_MEMORY_SHARE = 2  # on a shared GPU: f32 master weights + Adam moments + grads vs bf16 weights + KV
# Variables a misplaced role names in its message (those set, plus the visibility ones even when unset).
SEEN = ("RLAX_ACCELERATOR", "RLAX_CHIPS", "JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS",
        "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_BOUNDS", "TPU_PROCESS_PORT", "TPU_PROCESS_ADDRESSES",
        "CLOUD_TPU_TASK_ID", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE")
ALWAYS_SHOWN = ("JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS")


class PlacementError(ValueError):
    pass


@dataclass
class Config:
    """How launch.sh splits this machine's chips between the roles (its settings of the same names)."""
    accelerator: str = "auto"
    """ACCELERATOR: auto (detect), cpu, tpu or gpu"""
    chips: int = 0
    """CHIPS: chips to place on, overriding detection (placement can then be tried on any machine); 0 =
    detect"""
    trainer_chips: int = 0
    """TRAINER_CHIPS: the trainer's chips; 0 = half of them (at least 1)"""
    worker_chips: int = 1
    """WORKER_CHIPS: chips per inference worker; > 1 = tensor-parallel workers (--tensor-parallel)"""
    workers: int = -1
    """WORKERS: inference workers; -1 = 2 on the CPU, else one per WORKER_CHIPS of the chips left"""
    trainer_tp: int = 1
    """TRAINER_TP: the trainer mesh's 'tensor' axis (--tensor-parallel); its chips / TRAINER_TP = 'data'"""
    tpu_port_base: int = 8476
    """TPU_PORT_BASE: libtpu port of the trainer; worker i uses this + 1 + i"""
    gpu_mem_budget: float = 0.9
    """GPU_MEM_BUDGET: fraction of each GPU's memory that the roles on it preallocate together"""
    reserved_ports: str = ""
    """comma-separated ports taken already (the parameter server's and the verifiers')"""
    roles: str = "trainer,workers"
    """the chip-using roles this host runs (launch.sh's ROLES without param_server and verifier):
    trainer, workers, both or neither. Without workers the trainer takes every chip (unless
    TRAINER_CHIPS); without the trainer the workers share them all"""
    multihost_trainer: bool = False
    """the trainer is one process of several on several hosts (launch.sh: TRAINER_HOSTS > 1 or
    TRAINER_COORDINATOR=auto): on a TPU it takes every chip of this host and gets none of the
    one-process libtpu variables, so libtpu forms one slice of all its hosts' chips"""

    def __post_init__(self):
        if self.accelerator not in ("auto",) + PLATFORMS:
            raise ValueError(f"ACCELERATOR={self.accelerator!r}: must be one of auto, {', '.join(PLATFORMS)}")
        if min(self.chips, self.trainer_chips) < 0 or min(self.worker_chips, self.trainer_tp) < 1:
            raise ValueError("CHIPS and TRAINER_CHIPS must be >= 0, WORKER_CHIPS and TRAINER_TP >= 1")
        if self.workers < -1:
            raise ValueError("WORKERS must be >= 0")
        if not 0 < self.gpu_mem_budget <= 1:
            raise ValueError("GPU_MEM_BUDGET must be in (0, 1]")
        if unknown := set(filter(None, self.roles.split(","))) - {"trainer", "workers"}:
            raise ValueError(f"roles: {sorted(unknown)} are not chip-using roles (trainer, workers)")


@dataclass
class Role:
    """One role's placement: the variables on its line and the flags appended to its command."""
    name: str
    env: dict = field(default_factory=dict)
    flags: str = ""
    chips: tuple = ()


# ----------------------------------------------------------------------------- detection

def detect() -> tuple[str, int, str]:
    """(platform, chip count, how it was found) for this machine, without importing jax."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
            gpus = [line for line in out.splitlines() if line.startswith("GPU ")]
            if gpus:
                return "gpu", len(gpus), "nvidia-smi -L"
        except (OSError, subprocess.SubprocessError):
            pass
    # TPU v2-v4 chips are /dev/accel0..; v5e, v5p and v6e chips are VFIO devices /dev/vfio/0.. (plus the
    # /dev/vfio/vfio container, not a chip).
    for pattern in ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*"):
        if chips := glob.glob(pattern):
            return "tpu", len(chips), pattern
    if gpus := glob.glob("/dev/nvidia[0-9]*"):  # a GPU container without nvidia-smi
        return "gpu", len(gpus), "/dev/nvidia[0-9]*"
    return "cpu", 0, "no nvidia-smi GPU, /dev/accel*, /dev/vfio/* or /dev/nvidia*"


# ----------------------------------------------------------------------------- the plan (pure)

def plan(platform: str, chip_ids: list, trainer_chips: int = 0, worker_chips: int = 1, workers: int = -1,
         trainer_tp: int = 1, tpu_port_base: int = 8476, gpu_mem_budget: float = 0.9,
         reserved_ports=(), host_roles=("trainer", "workers"), multihost_trainer: bool = False) -> list[Role]:
    """Every role's placement, in launch.sh's start order: param_server, verifier, worker-0.., trainer.
    chip_ids: the chips' names for the visibility variable (0..N-1, or the entries of a
    CUDA_VISIBLE_DEVICES that launch.sh was given). host_roles: which of trainer and workers this host
    runs (a multi-host run, docs/multihost.md); a role not here is left out and its chips go to the
    other. multihost_trainer: the trainer is one process of a multi-host slice (Config.multihost_trainer).
    Raises PlacementError on a split that cannot work.
    The steps: the trainer's chips (_trainer_chip_count), the workers' (_worker_groups), then each
    role's environment (_tpu_env, _gpu_env)."""
    with_trainer, with_workers = "trainer" in host_roles, "workers" in host_roles
    if not with_workers:
        workers = 0
    if not with_trainer and trainer_chips:
        raise PlacementError(f"TRAINER_CHIPS={trainer_chips} but this host runs no trainer (ROLES)")
    off_accelerator = {"JAX_PLATFORMS": "cpu", **({"CUDA_VISIBLE_DEVICES": ""} if platform == "gpu" else {})}
    services = [Role("param_server", dict(off_accelerator)), Role("verifier", dict(off_accelerator))]
    trainer_flags = f"--tensor-parallel {trainer_tp}" if trainer_tp > 1 else ""
    if platform == "cpu":
        if trainer_chips or worker_chips > 1:
            raise PlacementError("TRAINER_CHIPS and WORKER_CHIPS place roles on an accelerator; this "
                                 "placement is cpu (set ACCELERATOR=tpu|gpu, and CHIPS to try it here)")
        on_cpu = {"JAX_PLATFORMS": "cpu", "RLAX_ACCELERATOR": "cpu"}
        n_workers = 2 if workers == -1 else workers
        return (services + [Role(f"worker-{i}", dict(on_cpu)) for i in range(n_workers)]
                + ([Role("trainer", dict(on_cpu), trainer_flags)] if with_trainer else []))
    if platform not in PLATFORMS:
        raise PlacementError(f"unknown platform {platform!r}: one of {', '.join(PLATFORMS)}")

    T = _trainer_chip_count(platform, len(chip_ids), trainer_chips, trainer_tp, with_trainer, with_workers,
                            multihost_trainer)
    W = worker_chips
    groups, workers = _worker_groups(platform, chip_ids, T, W, workers)
    placed = ([("trainer", tuple(chip_ids[:T]))] if with_trainer else []) + [
        (f"worker-{i}", groups[i % len(groups)]) for i in range(workers)]

    roles = (_tpu_env(placed, chip_ids, tpu_port_base, reserved_ports, multihost_trainer) if platform == "tpu"
             else _gpu_env(placed, gpu_mem_budget))
    for name, chips in placed:
        roles[name].update(RLAX_ACCELERATOR=platform, RLAX_CHIPS=str(len(chips)))
    worker_flags = f"--tensor-parallel {W}" if W > 1 else ""
    return (services
            + [Role(name, roles[name], worker_flags, chips) for name, chips in placed if name != "trainer"]
            + [Role("trainer", roles["trainer"], trainer_flags, chips) for name, chips in placed if name == "trainer"])


def _trainer_chip_count(platform: str, n: int, trainer_chips: int, trainer_tp: int, with_trainer: bool,
                        with_workers: bool, multihost_trainer: bool) -> int:
    """T, the trainer's chips of this host's n (the first T of chip_ids; plan's step): TRAINER_CHIPS,
    else half the chips when workers share the host, all of them when they do not."""
    T = (trainer_chips or (max(1, n // 2) if with_workers else n)) if with_trainer else 0
    if n == 0:
        raise PlacementError(f"no {platform.upper()} chips to place on (set CHIPS to say how many)")
    if T > n:
        raise PlacementError(f"TRAINER_CHIPS={T} but there are only {n} chips")
    if T % trainer_tp:
        raise PlacementError(f"TRAINER_TP={trainer_tp} must divide the trainer's {T} chips")
    if platform == "tpu" and multihost_trainer and with_trainer and T != n:
        raise PlacementError(f"a trainer across TPU hosts takes every chip of its host (libtpu makes one slice "
                             f"of all its hosts' chips), but here it would get {T} of {n}: run its host's "
                             f"workers on other hosts (ROLES without workers) and leave TRAINER_CHIPS unset")
    return T


def _worker_groups(platform: str, chip_ids: list, T: int, W: int, workers: int) -> tuple[list, int]:
    """(groups, workers) (plan's step): groups of W chips each, from the chips after the trainer's T,
    that the workers take in turn, and how many workers (workers=-1: one per group). A TPU chip serves
    one process, so TPU workers never share; on GPUs with too few chips for a worker of its own,
    the one group is the trainer's first W chips."""
    n, left = len(chip_ids), list(chip_ids[T:])
    groups = [tuple(left[i:i + W]) for i in range(0, len(left) - W + 1, W)]  # one worker's chips each
    why = f"{n} chip(s), {T} for the trainer, {W} per worker"
    if platform == "tpu":
        if workers == -1:
            workers = len(groups)
            if workers == 0:
                raise PlacementError(f"{why}: no chip left for a worker, and a TPU chip serves one "
                                     f"process (a lower TRAINER_CHIPS, or a host with more chips)")
        if workers > len(groups):
            raise PlacementError(f"WORKERS={workers} does not fit: {why} leaves room for {len(groups)} "
                                 f"(a TPU chip serves one process)")
    else:
        if not groups:  # too few GPUs for a worker of its own (one GPU): share the trainer's
            if W > n:
                raise PlacementError(f"WORKER_CHIPS={W} but there are only {n} GPUs")
            groups = [tuple(chip_ids[:W])]
        if workers == -1:
            workers = len(groups)
    return groups, workers


def _tpu_env(placed: list, chip_ids: list, tpu_port_base: int, reserved_ports, multihost_trainer: bool) -> dict:
    """Each placed TPU role's environment: its chips, their bounds, its libtpu port (plan's helper)."""
    roles = {}
    # the trainer's libtpu port is tpu_port_base, worker i's tpu_port_base + 1 + i (on every host)
    # (a trainer across hosts has no port of ours: libtpu takes the slice's own)
    ports = [tpu_port_base + (0 if name == "trainer" else 1 + int(name.split("-")[1])) for name, _ in placed]
    used = [p for (name, _), p in zip(placed, ports) if not (name == "trainer" and multihost_trainer)]
    if clash := sorted(set(used) & {int(p) for p in reserved_ports}):
        raise PlacementError(f"libtpu ports {used[0]}-{used[-1]} clash with port(s) {clash} of the "
                             f"parameter server / verifier: set TPU_PORT_BASE or PORT")
    position = {c: i for i, c in enumerate(chip_ids)}
    for (name, chips), port in zip(placed, ports):
        if name == "trainer" and multihost_trainer:  # every chip of the host; the slice's topology
            roles[name] = {"JAX_PLATFORMS": JAX_PLATFORM["tpu"]}
            continue
        first = position[chips[0]]
        if len(chips) not in TPU_BOUNDS or first % len(chips):
            raise PlacementError(
                f"{name} would get TPU chips {','.join(map(str, chips))}: a process's chips must be "
                f"1, 2, 4 or 8 aligned chips (a block of the host's grid); choose TRAINER_CHIPS and "
                f"WORKER_CHIPS among 1, 2, 4, 8 with TRAINER_CHIPS a multiple of WORKER_CHIPS")
        roles[name] = {"JAX_PLATFORMS": JAX_PLATFORM["tpu"], "TPU_VISIBLE_CHIPS": ",".join(map(str, chips)),
                       "TPU_CHIPS_PER_PROCESS_BOUNDS": TPU_BOUNDS[len(chips)], "TPU_PROCESS_BOUNDS": "1,1,1",
                       "TPU_PROCESS_PORT": str(port), "TPU_PROCESS_ADDRESSES": f"localhost:{port}",
                       "CLOUD_TPU_TASK_ID": "0", "ALLOW_MULTIPLE_LIBTPU_LOAD": "true"}
    return roles


def _gpu_env(placed: list, gpu_mem_budget: float) -> dict:
    """Each placed GPU role's environment: its GPUs and its share of their memory (plan's helper)."""
    roles = {}
    share = {"trainer": TRAINER_MEMORY_SHARE}
    load = {}  # GPU -> memory shares of the roles on it
    for name, chips in placed:
        for c in chips:
            load[c] = load.get(c, 0) + share.get(name, 1)
    for name, chips in placed:
        # floor to 2 decimals, so the fractions of the roles on one GPU sum to <= the budget
        frac = min(int(100 * gpu_mem_budget * share.get(name, 1) / load[c] + 1e-9) for c in chips) / 100
        if frac <= 0:
            raise PlacementError(f"{name}: too many roles on one GPU for GPU_MEM_BUDGET={gpu_mem_budget}")
        roles[name] = {"JAX_PLATFORMS": JAX_PLATFORM["gpu"], "CUDA_VISIBLE_DEVICES": ",".join(map(str, chips)),
                       "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{frac:.2f}"}
    return roles


def describe(platform: str, how: str, roles: list[Role]) -> str:
    """One comment line for commands.sh: who got which chips."""
    if platform == "cpu":
        return f"# placement: cpu ({how}): every role on the CPU"
    users = {}
    for r in roles:
        for c in r.chips:
            users[c] = users.get(c, 0) + 1
    parts = [f"{r.name} {','.join(map(str, r.chips))}" + (" (shared)" if any(users[c] > 1 for c in r.chips) else "")
             for r in sorted(roles, key=lambda r: r.name != "trainer") if r.chips]  # the trainer first
    return (f"# placement: {platform}, {how}: {'; '.join(parts) or 'no role of this host uses them'}; "
            f"param_server and verifier on the CPU")


def main(argv=None) -> int:
    """launch.sh's call: print comment lines (the placement, any note), then `role|VAR=value ...|flags` per
    role."""
    cfg = cli.parse(Config, argv=argv)
    try:
        platform, count, how = detect() if cfg.accelerator == "auto" else (cfg.accelerator, 0, "ACCELERATOR")
        chip_ids = []
        if platform == "cpu" and cfg.chips:
            raise PlacementError(f"CHIPS={cfg.chips} but the placement is cpu ({how}): set ACCELERATOR=tpu or gpu")
        if platform != "cpu" and cfg.chips:
            chip_ids, how = list(range(cfg.chips)), "CHIPS"
        elif platform != "cpu":
            if not count:
                found, count, how = detect()
                if found != platform:
                    raise PlacementError(f"ACCELERATOR={platform} but no {platform.upper()} was found ({how}); "
                                         f"set CHIPS to place on {platform} anyway")
            chip_ids, visible = list(range(count)), os.environ.get("CUDA_VISIBLE_DEVICES", "")
            if platform == "gpu" and visible:  # honour the GPUs launch.sh itself was restricted to
                chip_ids, how = visible.split(","), "CUDA_VISIBLE_DEVICES"
        if platform == "gpu" and os.environ.get("XLA_CLIENT_MEM_FRACTION"):
            raise PlacementError("XLA_CLIENT_MEM_FRACTION is set, but launch.sh sizes each GPU role's memory "
                                 "with XLA_PYTHON_CLIENT_MEM_FRACTION and JAX refuses both: unset it (the "
                                 "roles' total is GPU_MEM_BUDGET)")
        roles = plan(platform, chip_ids, cfg.trainer_chips, cfg.worker_chips, cfg.workers, cfg.trainer_tp,
                     cfg.tpu_port_base, cfg.gpu_mem_budget,
                     [p for p in cfg.reserved_ports.split(",") if p.strip()],
                     tuple(filter(None, cfg.roles.split(","))), cfg.multihost_trainer)
    except PlacementError as e:
        print(f"launch.sh: cannot place the roles: {e}", file=sys.stderr)
        return 2
    print(describe(platform, f"{len(chip_ids)} chip(s) ({how})" if chip_ids else how, roles))
    if platform != "cpu" and cfg.worker_chips != cfg.trainer_tp and any(r.name.startswith("worker-") for r in roles):
        print(f"# note: workers --tensor-parallel {cfg.worker_chips}, trainer {cfg.trainer_tp}: a split matmul sums in "
              f"another order, so sampler and trainer log-probs are not bitwise equal (TRAINER_TP={cfg.worker_chips})")
    for r in roles:
        print(f"{r.name}|{' '.join(f'{k}={v}' for k, v in r.env.items())}|{r.flags}")
    return 0


# ----------------------------------------------------------------------------- the check, in each role

def _seen() -> str:
    return " ".join(f"{k}={os.environ[k]!r}" if k in os.environ else f"{k} unset"
                    for k in SEEN if k in os.environ or k in ALWAYS_SHOWN)


def check(role: str) -> list:
    """Log the devices JAX gives this role; exit(EXIT_MISPLACED) if launch.sh placed it on an accelerator
    (RLAX_ACCELERATOR=tpu|gpu) and it did not get exactly that: only the CPU, or not RLAX_CHIPS chips.
    Returns this process's devices (jax.local_devices(): a trainer across hosts checks its own host's)."""
    placed = os.environ.get("RLAX_ACCELERATOR", "")
    chips = int(os.environ.get("RLAX_CHIPS", "0") or 0)
    if placed not in ("",) + PLATFORMS:
        _stop(role, f"RLAX_ACCELERATOR={placed!r} is not one of {', '.join(PLATFORMS)}")
    import jax  # here, not above: launch.sh imports this file for the plan and must not start JAX

    try:
        devs, error = jax.local_devices(), None
    except RuntimeError as e:  # JAX_PLATFORMS named a platform that could not start
        devs, error = [], e
    platform = devs[0].platform if devs else "none"
    kinds = ", ".join(sorted({d.device_kind for d in devs}))
    got = f"{len(devs)} {platform} device(s) ({kinds})" if devs else "no devices"
    print(f"{role}: jax {jax.__version__}: {got}; placed on {placed or 'unspecified'}; {_seen()}", flush=True)
    if placed in ("", "cpu"):
        return devs
    if platform != placed:
        plugins = [m for m in ("jax_cuda12_plugin", "jax_cuda13_plugin", "libtpu") if importlib.util.find_spec(m)]
        _stop(role, f"placed on {placed} but JAX found {'only ' + platform if devs else 'no'} devices"
                    + (f" ({str(error).splitlines()[0]})" if error else "") + ".\n"
                    f"  variables: {_seen()}\n  jax {jax.__version__}, accelerator plugins installed: "
                    f"{', '.join(plugins) or 'none'} (pip install -r requirements-{placed}.txt), or run the "
                    f"whole launch on the CPU with ACCELERATOR=cpu")
    if chips and not (len(devs) == chips or (placed == "tpu" and len(devs) == 2 * chips)):
        _stop(role, f"placed on {chips} {placed} chip(s) but JAX sees {len(devs)} devices: the visibility "
                    f"variables were not honoured.\n  variables: {_seen()}")
    return devs


def _stop(role: str, why: str) -> None:
    print(f"{role}: refusing to run: {why}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_MISPLACED)


if __name__ == "__main__":
    sys.exit(main())
