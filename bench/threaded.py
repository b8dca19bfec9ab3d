"""The study's improved client design on threads, with `http.client` (no aiohttp import,
so its memory figure is its own). See `baselines` for the design notes."""

from __future__ import annotations

import http.client
import queue
import random
import threading
import time
from urllib.parse import urlsplit

from .limiters import AdaptiveRing
from .spec import RunSpec
from .tally import FAILED, OK, Tally, classify
from .work import DRAIN_S, MAX_ATTEMPTS, BenchRequest, NonceSource, arrival_gaps, query, soft_queue_cap


def run_improved_threads(spec: RunSpec) -> Tally:
    """The study's improved client design on threads with `http.client`."""
    client = _ThreadedClient(spec)
    threads = []
    tallies: list[Tally] = []
    gen_tally = Tally()
    tallies.append(gen_tally)
    threads.append(threading.Thread(target=client.generator, args=(gen_tally,), daemon=True))
    threads.append(threading.Thread(target=client.dlq_manager, daemon=True))
    for key in spec.keys:
        t = Tally()
        tallies.append(t)
        threads.append(threading.Thread(target=client.worker, args=(key, t), daemon=True))
    for thread in threads:
        thread.start()
    time.sleep(spec.duration_s)
    client.stop.set()  # workers finish the send in hand (1 s timeout), then leave
    deadline = time.monotonic() + DRAIN_S + 1.0
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    total = Tally()
    for t in tallies:
        total.merge(t)
    return total


class _ThreadedClient:
    """What the generator, the dead-letter manager and the key workers share: the queues,
    the stop flag and where to send."""

    def __init__(self, spec: RunSpec):
        self.spec = spec
        parts = urlsplit(spec.url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = parts.path or "/"
        self.main_q: queue.Queue[BenchRequest] = queue.Queue()
        self.dlq: queue.Queue[BenchRequest] = queue.Queue()
        self.stop = threading.Event()
        self.window_ms = spec.window_s * 1000.0

    def generator(self, tally: Tally) -> None:
        spec, stop, main_q = self.spec, self.stop, self.main_q
        gap = arrival_gaps(spec.offered_tps, random.Random(spec.seed))
        next_t = time.monotonic()
        rid, cap = 0, soft_queue_cap(spec.offered_tps)
        while not stop.is_set():
            now = time.monotonic()
            if next_t > now:
                time.sleep(next_t - now)
                continue
            if main_q.qsize() >= cap:
                time.sleep(0.5)
                continue
            rid += 1
            tally.generated += 1
            main_q.put(BenchRequest(rid, now + spec.ttl_s))
            next_t = max(next_t + gap(), now - 0.05)

    def dlq_manager(self) -> None:
        while not self.stop.is_set():
            try:
                self.main_q.put(self.dlq.get(timeout=0.05))
            except queue.Empty:
                pass

    def _connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=1.0)

    def worker(self, key: str, tally: Tally) -> None:
        limiter = AdaptiveRing(self.spec.limit, self.window_ms)
        nonces = NonceSource()
        conn = self._connect()
        try:
            while not self.stop.is_set():
                try:
                    req = self.main_q.get(timeout=0.05)
                except queue.Empty:
                    continue
                if not _wait_for_slot(limiter, req):
                    tally.expired += 1
                    continue
                limiter.take(time.monotonic() * 1000.0)
                req.attempts += 1
                tally.sent += 1
                nonce = nonces.next() if self.spec.nonce else None
                conn, kind, rtt_ms = self._send(conn, f"{self.path}?{query(key, req.id, nonce)}")
                tally.answer(kind, rtt_ms)
                limiter.record_latency(rtt_ms)
                if kind != OK:
                    if req.attempts >= MAX_ATTEMPTS:
                        tally.graveyard += 1
                    else:
                        self.dlq.put(req)
        finally:
            conn.close()

    def _send(
        self, conn: http.client.HTTPConnection, target: str
    ) -> tuple[http.client.HTTPConnection, str, float]:
        """One GET: the connection to use next (a new one after a failure), the answer's kind, its rtt in ms."""
        start = time.monotonic()
        try:
            conn.request("GET", target)
            resp = conn.getresponse()
            kind = classify(resp.status, resp.read().decode("utf-8", "replace"))
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = self._connect()
            kind = FAILED
        return conn, kind, (time.monotonic() - start) * 1000.0


def _wait_for_slot(limiter: AdaptiveRing, req: BenchRequest) -> bool:
    """Sleep until the limiter allows a send; False if `req` expires first (or already has)."""
    if time.monotonic() >= req.deadline:
        return False
    while (wait := limiter.wait_ms(time.monotonic() * 1000.0)) > 0:
        if time.monotonic() >= req.deadline:
            return False
        time.sleep(wait / 1000.0)
    return time.monotonic() < req.deadline
