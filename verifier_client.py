"""The verifier service's one client: VerifierFleet, a wire.Client per verifier address, with failover.

Processes that use it: the inference worker (inference_worker.verifier_fleet, every batch of
completions), warmup.py (warmup.verifier_service: scoring the cold-start checkpoint) and curate.py
(the dataset's pass rates and `curate.py check`). It is a module of its own, not part of verifier.py,
because every role may import it while none may import verifier.py (a role: it imports the sandbox
and forks executors); it imports only wire.py and verdicts.py.

Messages: wire.VerifyBatch out, wire.Verdicts (or an Error) back; wire.Ping / wire.Pong while a
batch is out, each pong saying how long the batch may still take; wire.CancelBatch for a batch given
up on while its verifier is alive. Every verdict received is checked (verdicts.check_batch) before it
becomes a Verdict.
"""
from __future__ import annotations

import math
import time
import zlib
from typing import Callable

from verdicts import INFRA_ERROR, BoundaryError, Verdict, check_batch, make_verdict, verdict_from_dict
from wire import CancelBatch, Client, Error, Ok, Ping, Pong, RemoteError, Verdicts, VerifyBatch


class VerifierFleet:
    """A Client per address, batches round robin, failover.

    A batch goes to one verifier, pinged every ping_s while the batch is out (the first time after at
    most timeout_s / 2). Each pong says how long the batch may still take, a bound that holds whatever
    its programs do (its jobs' own limits and the work queued ahead of them:
    verifier.py:ExecutorPool.submit_batch), and that bound, at least timeout_s, is the batch's
    deadline: a slow or looping program gets its own verdict (timeout) and never turns its
    neighbours' into infra failures. Until the first pong, and for a verifier that does not say, the
    deadline is timeout_s. A verifier that does not answer (no pong within 2 x ping_s,
    no verdicts by the deadline, or a pong that does not name the batch: it restarted and lost it) or
    answers badly (verdicts.check_batch: a verdict per job, a known status, a reward in range) is
    skipped for cooldown_s and the whole batch goes to the next; one still answering pings is first
    told to drop the batch (wire.CancelBatch), so no job given up on holds its executors (a batch whose
    client stops pinging, its process gone, is dropped there too: wire.VerifyBatch.ping_s). Only when
    every try failed is it an infrastructure failure: every job gets INFRA_ERROR, never a silent 0. A
    verifier that answers with an Error is alive: not skipped. A fleet of one gets a second try on a
    fresh connection, whose first pong may take timeout_s: time for a restarted service (launch.sh
    restarts it) to come back."""

    def __init__(self, name: str, addrs: list[str], *, timeout_s: float = 120.0, ping_s: float = 2.0,
                 cooldown_s: float = 30.0, log: Callable[[str], None] = print):
        """Sockets connect lazily: a verifier down now is fine. Each fleet starts its round robin at
        its own place (from `name`), so workers started together do not all pick the same verifier.
        timeout_s: the least a try waits for its verdicts (above)."""
        if not addrs:
            raise ValueError(f"{name}: a verifier fleet needs at least one address")
        if not (timeout_s > 0 and ping_s > 0 and cooldown_s >= 0):
            raise ValueError(f"{name}: timeout_s and ping_s must be > 0, cooldown_s >= 0")
        self.name, self.timeout_s, self.ping_s, self.cooldown_s, self.log = name, timeout_s, ping_s, cooldown_s, log
        self.clients = [Client(name, a, timeout_s=timeout_s) for a in addrs]
        self.next = zlib.crc32(name.encode()) % len(self.clients)
        self.down: dict[int, float] = {}  # index -> time.monotonic() until which it is skipped
        self.bound_s: float | None = None  # the last try's bound from its verifier's first pong (None: not said)

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
                reply = self._try(client, jobs, retry=i in tried)
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

    def _try(self, client: Client, jobs: list, retry: bool):
        """Send the batch to one verifier and return its reply (RemoteError for an Error), pinging it
        every ping_s (the first time sooner if timeout_s is shorter); TimeoutError when it is gone or
        hung (a pong missing for 2 x ping_s; on a retry, the first may take timeout_s), lost the
        batch, or let the deadline pass (then, if it ever answered a ping, it is told to drop the
        batch). A try given up on reconnects, so no late reply to it is ever read."""
        what = f"verify_batch ({len(jobs)} verdicts)"
        start = time.monotonic()
        rid = client.send(VerifyBatch(jobs=jobs, ping_s=self.ping_s))
        deadline, by, alive, self.bound_s = start + self.timeout_s, f"within {self.timeout_s:.1f}s", False, None
        ping_rid, pinged, pong_due, next_ping = None, start, math.inf, start + min(self.ping_s, self.timeout_s / 2)
        while True:
            now = time.monotonic()
            if now >= pong_due:
                client.reconnect()
                raise TimeoutError(f"{self.name}: no reply to {what} from {client.addr} and no pong within "
                                   f"{pong_due - pinged:.1f}s after {now - start:.1f}s")
            if now >= deadline:
                note = f"; {self._cancel(client, rid)}" if alive else ""
                client.reconnect()
                raise TimeoutError(f"{self.name}: no reply to {what} from {client.addr} {by}{note}")
            if now >= next_ping:
                ping_rid, pinged, next_ping = client.send(Ping()), now, math.inf
                pong_due = max(now + 2 * self.ping_s, start + self.timeout_s if retry and not alive else 0.0)
            if (got := client.receive(min(deadline, pong_due, next_ping) - now)) is None:
                continue
            reply, reply_rid = got
            if isinstance(reply, Error) and reply_rid in (rid, 0):
                raise RemoteError(reply.error)
            if reply_rid == rid:
                return reply
            if reply_rid != ping_rid:
                continue  # a late reply to an earlier request; dropped
            now, alive = time.monotonic(), True
            ping_rid, pong_due, next_ping = None, math.inf, now + self.ping_s
            batches = reply.info.get("batches") if isinstance(reply, Pong) else None
            if not isinstance(batches, dict):
                continue  # a verifier that does not say how long: timeout_s
            left = batches.get(str(rid))
            if type(left) not in (int, float) or left < 0:
                client.reconnect()
                raise TimeoutError(f"{self.name}: {client.addr} does not hold {what} (it restarted?)")
            if self.bound_s is None:  # the bound is fixed when the batch is queued: later pongs only say alive
                self.bound_s = now - start + left
                deadline = max(start + self.timeout_s, now + left + 2 * self.ping_s)
                by = f"within {deadline - start:.1f}s (the verifier's bound for the batch, at least {self.timeout_s:g}s)"

    def _cancel(self, client: Client, rid: int) -> str:
        """Tell a live verifier to drop batch `rid` (wire.CancelBatch), waiting up to 2 x ping_s for
        its answer. Returns what came of it, for the log."""
        try:
            answer = client.call(CancelBatch(request=rid), 2 * self.ping_s, "cancel_batch")
        except (TimeoutError, RemoteError) as e:
            return f"cancelling it failed: {e}"
        return (f"it dropped {answer.info.get('cancelled')} of its jobs" if isinstance(answer, Ok)
                else f"it answered the cancel with {answer.TYPE}")

    def close(self) -> None:
        for c in self.clients:
            c.close()
