"""Verdicts only the verifier can make: a MAC over what was scored, with a key the workers never hold.

A worker reports its rollouts' rewards, but it does not make them: the verifier does. With a verdict key
(launch.sh writes one per run, $RUN_DIR/verdict.key, and hands it to the verifier and the param server,
never to a worker) the verifier seals each verdict it serves:

    mac = HMAC-SHA256(key, [context, sha256(job), reward, status])

- `context` names the row the worker says the job scores: "<item_id>|<lease>|<row>". The verifier
  cannot check it (it knows no items); it only binds the verdict to it, so a verdict cannot be moved to
  another row, another item or another lease (a replay of an older rollout of the item).
- `job` is the whole verifier job (the program, the tests or cases or answer, the limits). The param
  server rebuilds it from the item it issued and the completion the rollout carries (envs.score_jobs,
  the one place jobs are built), so a verdict of other tests, a shorter time limit or another
  completion does not match.
- `reward` and `status` are the verdict itself, the reward as the float32 the rollout carries.

The param server checks every row's MAC when a rollout is submitted (param_server.WorkQueue.submit); a
rollout with one that does not check is forged: refused, its worker refused from then on, and the items it
holds issued to others. Standard library only: the verifier imports this in its parent process.
"""

import hashlib
import hmac
import json
import os
import secrets
import struct

KEY_BYTES = 32


def write_key(path: str) -> str:
    """A new random key in `path` (hex, chmod 600), unless one is there; returns the path."""
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(KEY_BYTES) + "\n")
    return path


def read_key(path: str) -> bytes:
    """The key in `path` (written by write_key); ValueError if it is not one."""
    with open(path) as f:
        text = f.read().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise ValueError(f"{path} does not hold a verdict key (hex, at least 16 bytes: python attest.py keygen)")
    return key


def context(item_id: str, lease: str, row: int) -> str:
    """The row a verdict is for: what the worker puts in the job's "seal" field."""
    return f"{item_id}|{lease}|{row}"


def job_digest(job: dict) -> str:
    """sha256 of the job as canonical JSON (sorted keys, without its "id" and "seal"): the same whether
    it was built here or arrived over msgpack (a tuple and a list serialize alike)."""
    body = {k: v for k, v in job.items() if k not in ("id", "seal")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=True).encode()).hexdigest()


def seal(key: bytes, ctx: str, job: dict, reward: float, status: str) -> str:
    """The MAC of one verdict (hex). The reward is sealed as the float32 a rollout carries it in."""
    msg = json.dumps([ctx, job_digest(job), struct.unpack("<f", struct.pack("<f", reward))[0].hex(), status]).encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def check(key: bytes, ctx: str, job: dict, reward: float, status: str, mac: str) -> bool:
    """Whether `mac` is the verifier's seal of this verdict for this row and job (constant time)."""
    return isinstance(mac, str) and hmac.compare_digest(seal(key, ctx, job, reward, status), mac)


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description="Verdict keys: give one to the verifier and the param "
                                                 "server (--verdict-key), never to a worker.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("keygen", help="write a new key to PATH (chmod 600) unless one is there").add_argument("path")
    args = parser.parse_args()
    print(write_key(args.path))
