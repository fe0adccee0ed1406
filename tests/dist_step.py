"""One trainer process of tests/test_distributed.py: a real trainer.Trainer (the embedded task, no param
server needed) runs the leader's commands on a fixed batch: update (two minibatches, two epochs, so the
pi_old forward runs too), checkpoint, restore, checkpoint again. (The KL term's pi_ref forward and the
export run across two trainer processes in tests/test_multihost.py's loopback run.)

    python tests/dist_step.py MODEL OUT DEVICES [COORDINATOR NUM_PROCESSES PROCESS_ID]

The leader writes OUT/result.npz (the update's log-probs and its scalars) and OUT/run/checkpoints/; a
follower writes nothing. The same script serves one process with DEVICES simulated devices
and several processes on loopback each with DEVICES, so their files can be compared.
"""
import os
import sys

model_path, out, n_devices = sys.argv[1], sys.argv[2], int(sys.argv[3])
coordinator, n_proc, proc_id = (sys.argv[4], int(sys.argv[5]), int(sys.argv[6])) if len(sys.argv) > 4 else ("", 1, 0)
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n_devices}"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import grpo  # noqa: E402
import multihost  # noqa: E402
import trainer  # noqa: E402
import update  # noqa: E402

multihost.initialize(coordinator, n_proc, proc_id)
cfg = trainer.Config(run_dir=os.path.join(out, "run"), model=model_path, param_server="tcp://127.0.0.1:9",
                     prompts_per_step=4, heldout=2, microbatch=4, minibatches=2, ppo_epochs=2,
                     coordinator=coordinator, num_processes=n_proc, process_id=proc_id)
gcfg = grpo.GRPOConfig(group_size=4)
t = trainer.Trainer(cfg, gcfg)
if not t.leader:
    raise SystemExit(t.follow())

rng = np.random.default_rng(0)
B, T, V = 16, t.T, t.mcfg.vocab_size
mask = np.zeros((B, T), np.float32)
mask[:, T // 2:] = rng.random((B, T - T // 2)) < 0.9
data = {"tokens_RT": rng.integers(0, V, (B, T)).astype(np.int32), "adv_R": rng.normal(size=B).astype(np.float32),
        "mask_RT": mask, "logp_behav_RT": (-rng.random((B, T)) * 3).astype(np.float32)}
logp_RT, aux = t.collective("update", {"minibatches": update.split_batch(data, cfg.minibatches, cfg.microbatch),
                                       "epochs": cfg.ppo_epochs})
t.collective("checkpoint", {"step": 1, "meta": {"cursor": 0}})
t.collective("restore")
t.collective("checkpoint", {"step": 2, "meta": {"cursor": 0}})
multihost.release(0)
np.savez(os.path.join(out, "result.npz"), logp_RT=logp_RT, processes=n_proc, devices=len(t.mesh.devices.flat),
         **{f"aux/{k}": v for k, v in aux.items()})
print(f"dist_step: process 0 of {n_proc}, mesh {dict(t.mesh.shape)}: done", flush=True)
