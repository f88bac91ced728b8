"""The delivery timer's loop: claim what is due (webhooks.engine), send it
concurrently on one event loop, and record the answers in batches, while a
single database thread does the ORM work.

`run(seconds=…, wait=True)` is the timer (webhooks.tasks): it stays for its
run, woken by nudges on its topic (webhooks.due.DUE_TOPIC) or
by its own short poll; `wait=False` sends what is due now and returns, a
moment later with `linger` (a helper run).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time

from django.db import InterfaceError, OperationalError, connections

from controlplane import faults, live, topics
from controlplane.clock import now, timestamp
from controlplane.processes import cluster_stopping
from webhooks import crypto
from webhooks.due import DUE_TOPIC
from webhooks.engine import MAX_IN_FLIGHT, Job, Result, log_attempt, record_or_leave, claim_due, next_due_in
from webhooks.transport import Transport

POLL_SECONDS = 0.05
# A timer that hears of new deliveries (webhooks.due.DUE_TOPIC) looks on its
# own only for what no nudge announces: retry times and expired leases, which
# next_due_in finds, and anything a lost nudge left.
NUDGED_POLL_SECONDS = 0.5
# A busy timer looks for lapsed leases and wrong clocks' claims (the
# recovering reads of webhooks.due.READY) this often, and on every claim
# that finds nothing due: they are rare, and each look is three more reads.
RECOVER_SECONDS = 1.0
# After the first answer, how long the others in flight may take to share
# its record. 25 ms rather than 10: a busy worker records fewer, bigger
# batches, and pushed items, each waiting for its record, flowed about a
# quarter faster (docs/benchmarks.md, round thirteen).
RECORD_WINDOW = 0.025
LOST_CONNECTION_PAUSE = 0.2
# How often at most a timer with a full room asks for a helper run (webhooks.tasks.ask_for_help).
ASK_SECONDS = 1.0
# How often a run looks for a rotated signing key: a run lasts 40 s and more,
# and signed every wake of it with the key it started with.
KEY_SECONDS = 1.0
# Hand-offs keep push chains going without a claim (webhooks.engine.record),
# but not into a worker's last quarter of room while something else is
# due: it (a wake, another subscription's first item, a retry) is claimed
# within a cycle, not after every chain has drained its inbox.
CLAIM_SHARE = 4
log = logging.getLogger(__name__)


class _Database:
    """ORM work off the event loop, on one thread that keeps its connection
    for the whole run (the loop goes on sending meanwhile)."""

    def __init__(self):
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="webhooks-db")

    async def __call__(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def lenient(self, fn, *args, default=None):
        """`fn(*args)`, or `default` if the database connection was lost (a
        restart, a failover): the thread's connections are dropped, so the
        next call opens a fresh one, and the loop goes on. What a lost claim
        had taken comes back when its leases run out; a lost record is
        `record_or_leave`'s."""
        try:
            return await self(fn, *args)
        except (OperationalError, InterfaceError) as error:
            log.warning("the delivery timer lost its database connection (%s); going on with a fresh one",
                        type(error).__name__)
            await self(connections.close_all)
            await asyncio.sleep(LOST_CONNECTION_PAUSE)
            return default

    async def close(self):
        await self(connections.close_all)
        self._executor.shutdown()


async def _send(transport: Transport, signer: crypto.Signer, job: Job) -> Result:
    started_at = now()
    if job.mcp_subscription_id is not None:
        headers = crypto.standard_headers(job.message_id, job.body, [crypto.open_secret(s) for s in job.mcp_secrets],
                                          timestamp=int(timestamp()), subscription_id=job.mcp_subscription_id)
        key_id = "whsec"
    else:
        headers = signer.headers(job.public_id, job.body, secret=crypto.open_secret(job.sealed_secret),
                                 timestamp=int(timestamp()))
        key_id = signer.key_id
    return log_attempt(Result(job, await transport.post(job.url, job.body, headers), key_id, started_at))


async def run(*, seconds: float, wait: bool, resolver=None, renew=None, hand_over=None, ask_for_help=None,
              linger: float = 0.0) -> int:
    """Send due wakes for up to `seconds`; returns how many were attempted.
    `renew` (the timer's key) is called about once a second, and
    `ask_for_help` (webhooks.tasks) at most once a second after a claim that
    filled the room: more is due than this run can hold. `hand_over` is
    called once the run's time is up with sends still in flight: the timer
    is another run's from then on, while this one waits for their answers
    (up to a request's 15 s, in which a timer that kept its key sent
    nothing else, to anyone).

    With `wait` (the timer), stay for the whole run, sending each wake as it
    falls due (debounce windows, retry times, new wakes); otherwise stop
    once nothing has been due for `linger` seconds (a helper's, kept for the
    next burst with its connections open; 0: as soon as nothing is due right
    now). Finished attempts are recorded in batches."""
    deadline = time.monotonic() + seconds
    db = _Database()
    in_flight: set[asyncio.Task] = set()
    sent = 0
    # The timer hears of new due deliveries at once (webhooks.due.DUE_TOPIC)
    # where the channel layer reaches the processes that commit them.
    nudged = asyncio.Event()
    listener = asyncio.create_task(topics.listen(DUE_TOPIC, lambda _: nudged.set())) \
        if (wait or linger) and live.shared_layer() else None
    poll = NUDGED_POLL_SECONDS if listener else POLL_SECONDS
    try:
        signer = crypto.Signer(await db(crypto.active_signing_key))
        async with Transport(resolver=resolver, limit=MAX_IN_FLIGHT) as transport:
            renewed = keyed = time.monotonic()
            recovered, found, asked, busy = 0.0, False, -ASK_SECONDS, time.monotonic()
            while True:
                if renew and time.monotonic() - renewed >= 1.0:
                    faults.point("webhooks.timer")
                    await db.lenient(renew)
                    renewed = time.monotonic()
                if time.monotonic() - keyed >= KEY_SECONDS:
                    key = await db.lenient(crypto.active_signing_key)
                    if key is not None and key.key_id != signer.key_id:
                        signer = crypto.Signer(key)  # requests already out keep theirs
                    keyed = time.monotonic()
                # A stopping worker ends the run: what is in flight is recorded, nothing more is claimed.
                stopping = cluster_stopping()
                remaining = 0 if stopping else deadline - time.monotonic()
                if remaining <= 0 and in_flight and hand_over and not stopping:
                    await db.lenient(hand_over)
                    hand_over = renew = None
                capacity = MAX_IN_FLIGHT - len(in_flight)
                jobs, recover = [], True
                if remaining > 0 and capacity > 0:
                    recover = not found or time.monotonic() - recovered >= RECOVER_SECONDS
                    jobs = await db.lenient(claim_due, capacity, recover, default=[])
                    recovered, found = time.monotonic() if recover else recovered, bool(jobs)
                in_flight |= {asyncio.create_task(_send(transport, signer, job)) for job in jobs}
                sent += len(jobs)
                busy = time.monotonic() if in_flight else busy
                stay = remaining if wait else min(remaining, busy + linger - time.monotonic())
                if ask_for_help and jobs and len(jobs) == capacity and time.monotonic() - asked >= ASK_SECONDS:
                    asked = time.monotonic()
                    await db(ask_for_help)
                if jobs and len(jobs) == capacity:
                    timeout = 0.002  # a full batch: more may be due; record what finished, then claim more
                elif in_flight:
                    # Until the first request finishes (its record may offer
                    # the next push, and frees room at its endpoint) or a
                    # nudge: a claim that found fewer than it had room for
                    # would find nothing more sooner.
                    timeout = poll
                elif not recover:
                    continue  # nothing fell due: look once more, for lapsed leases and wrong clocks' claims
                elif stay > 0:
                    # The timer stays for its run (a lingering run a while), looking for
                    # new and newly due wakes (due but held by another worker: soon again;
                    # a lingering run looks no more often than it polls, as what is due may
                    # be wakes the claim skips, their endpoints busy with the timer's sends).
                    soonest = await db.lenient(next_due_in, stay)
                    timeout = min(poll if soonest is None else max(soonest, 0.01 if wait else POLL_SECONDS), poll,
                                  stay)
                else:
                    break
                done = await _first_of(in_flight, nudged, timeout)
                in_flight -= done
                if done and in_flight:  # what else finishes within a few ms shares the transaction
                    more, in_flight = await asyncio.wait(in_flight, timeout=RECORD_WINDOW)
                    done |= more
                if done:
                    faults.point("webhooks.answered")  # sent and answered, not recorded
                    # Pushed items' next ones come back claimed (webhooks.engine.record),
                    # as many as there is room for, unless the run ends.
                    may_claim = not cluster_stopping() and time.monotonic() < deadline
                    room = max(0, MAX_IN_FLIGHT - len(in_flight)) if may_claim else 0
                    handed = await db(record_or_leave, [task.result() for task in done], room,
                                      max(1, MAX_IN_FLIGHT // CLAIM_SHARE))
                    in_flight |= {asyncio.create_task(_send(transport, signer, job)) for job in handed}
                    sent += len(handed)
                    busy = time.monotonic()
    finally:
        if in_flight:  # cancelled mid-run: the leases bring these back
            for task in in_flight:
                task.cancel()
        if listener:
            await topics.stop_task(listener)
        await db.close()
    return sent


async def _first_of(in_flight: set[asyncio.Task], nudged: asyncio.Event, timeout: float) -> set[asyncio.Task]:
    """Wait until a send finishes, a nudge comes or `timeout` passes; the
    finished sends. A nudge is used up here."""
    nudge = asyncio.ensure_future(nudged.wait())
    try:
        done, _ = await asyncio.wait({*in_flight, nudge}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        nudge.cancel()
    nudged.clear()
    return done - {nudge}
