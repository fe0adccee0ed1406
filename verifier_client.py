"""The verifier service's one client: VerifierFleet, a wire.Client per verifier address, with failover.

Processes that use it: the inference worker (inference_worker.verifier_fleet, every batch of
completions), warmup.py (warmup.verifier_service: scoring the cold-start checkpoint) and curate.py
(the dataset's pass rates and `curate.py check`). It is a module of its own, not part of verifier.py,
because every role may import it while none may import verifier.py (a role: it imports the sandbox
and forks executors); it imports only wire.py and verdicts.py.

Messages: wire.VerifyBatch out, wire.Verdicts (or an Error) back; wire.Ping / wire.Pong while a
batch is out (wire.Client.call with ping_s). Every verdict received is checked (verdicts.check_batch)
before it becomes a Verdict.
"""
from __future__ import annotations

import time
import zlib
from typing import Callable

from verdicts import INFRA_ERROR, BoundaryError, Verdict, check_batch, make_verdict, verdict_from_dict
from wire import Client, RemoteError, Verdicts, VerifyBatch


class VerifierFleet:
    """A Client per address, batches round robin, failover.

    A batch goes to one verifier; one that does not answer (no verdicts within timeout_s, or no pong
    within 2 x ping_s while the batch is out) or answers badly (verdicts.check_batch: a verdict per
    job, a known status, a reward in range) is skipped for cooldown_s and the whole batch goes to the
    next. Only when every try failed is it an infrastructure failure: every job gets INFRA_ERROR, never
    a silent 0. A verifier that answers with an Error is alive: not skipped. A fleet of one gets a
    second try on a fresh connection, not pinged: it waits timeout_s, time for a restarted service
    (launch.sh restarts it) to come back."""

    def __init__(self, name: str, addrs: list[str], *, timeout_s: float = 120.0, ping_s: float = 2.0,
                 cooldown_s: float = 30.0, log: Callable[[str], None] = print):
        """Sockets connect lazily: a verifier down now is fine. Each fleet starts its round robin at
        its own place (from `name`), so workers started together do not all pick the same verifier."""
        if not addrs:
            raise ValueError(f"{name}: a verifier fleet needs at least one address")
        if not (timeout_s > 0 and ping_s > 0 and cooldown_s >= 0):
            raise ValueError(f"{name}: timeout_s and ping_s must be > 0, cooldown_s >= 0")
        self.name, self.timeout_s, self.ping_s, self.cooldown_s, self.log = name, timeout_s, ping_s, cooldown_s, log
        self.clients = [Client(name, a, timeout_s=timeout_s) for a in addrs]
        self.next = zlib.crc32(name.encode()) % len(self.clients)
        self.down: dict[int, float] = {}  # index -> time.monotonic() until which it is skipped

    def order(self) -> list[int]:
        """The verifiers to try for the next batch: round robin from the next one, those cooling down
        last (in the order their cool-down ends), so a batch goes to a dead one only when every other
        one failed too. At least two tries: one verifier gets a second."""
        n, now = len(self.clients), time.monotonic()
        ring = [(self.next + k) % n for k in range(n)]
        self.next = (self.next + 1) % n
        up = [i for i in ring if self.down.get(i, 0.0) <= now]
        down = sorted((i for i in ring if i not in up), key=lambda i: self.down[i])
        return up + down if n > 1 else ring * 2

    def verify(self, jobs: list) -> list[Verdict]:
        """A checked Verdict per job, in order, from the first verifier of `order` that answers well."""
        if not jobs:
            return []
        order, error, tried = self.order(), "", set()
        for attempt, i in enumerate(order, 1):
            client = self.clients[i]
            try:
                reply = client.call(VerifyBatch(jobs=jobs), self.timeout_s, f"{len(jobs)} verdicts",
                                    ping_s=self.ping_s if i not in tried else None)
                if not isinstance(reply, Verdicts):
                    raise BoundaryError(f"a {reply.TYPE} reply to {len(jobs)} jobs")
                check_batch(jobs, reply.verdicts)
                self.down.pop(i, None)
                return [verdict_from_dict(d) for d in reply.verdicts]
            except (TimeoutError, BoundaryError) as e:  # dead, stuck, gone or answering garbage: skip it
                tried.add(i)
                self.down[i] = time.monotonic() + self.cooldown_s
                self.log(f"verifier attempt {attempt}/{len(order)} failed: {e}"
                         + (f"; skipping {client.addr} for {self.cooldown_s:.0f}s" if len(self.clients) > 1 else ""))
                error = f"{type(e).__name__}: {e}"
            except RemoteError as e:  # it answered with an error: alive, so not skipped
                tried.add(i)
                self.log(f"verifier attempt {attempt}/{len(order)} failed: {e}")
                error = f"{type(e).__name__}: {e}"
        return [make_verdict(INFRA_ERROR, error) for _ in jobs]

    def close(self) -> None:
        for c in self.clients:
            c.close()
