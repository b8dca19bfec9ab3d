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
    parts = urlsplit(spec.url)
    host, port, path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path or "/"
    main_q: queue.Queue[BenchRequest] = queue.Queue()
    dlq: queue.Queue[BenchRequest] = queue.Queue()
    stop = threading.Event()
    window_ms = spec.window_s * 1000.0
    tallies: list[Tally] = []

    def generator(tally: Tally) -> None:
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

    def dlq_manager() -> None:
        while not stop.is_set():
            try:
                main_q.put(dlq.get(timeout=0.05))
            except queue.Empty:
                pass

    def worker(key: str, tally: Tally) -> None:
        limiter = AdaptiveRing(spec.limit, window_ms)
        nonces = NonceSource()
        conn = http.client.HTTPConnection(host, port, timeout=1.0)
        try:
            while not stop.is_set():
                try:
                    req = main_q.get(timeout=0.05)
                except queue.Empty:
                    continue
                if time.monotonic() >= req.deadline:
                    tally.expired += 1
                    continue
                expired = False
                while (wait := limiter.wait_ms(time.monotonic() * 1000.0)) > 0:
                    if time.monotonic() >= req.deadline:
                        expired = True
                        break
                    time.sleep(wait / 1000.0)
                if expired or time.monotonic() >= req.deadline:
                    tally.expired += 1
                    continue
                limiter.take(time.monotonic() * 1000.0)
                req.attempts += 1
                tally.sent += 1
                target = f"{path}?{query(key, req.id, nonces.next() if spec.nonce else None)}"
                start = time.monotonic()
                try:
                    conn.request("GET", target)
                    resp = conn.getresponse()
                    kind = classify(resp.status, resp.read().decode("utf-8", "replace"))
                except (OSError, http.client.HTTPException):
                    conn.close()
                    conn = http.client.HTTPConnection(host, port, timeout=1.0)
                    kind = FAILED
                rtt_ms = (time.monotonic() - start) * 1000.0
                tally.answer(kind, rtt_ms)
                limiter.record_latency(rtt_ms)
                if kind != OK:
                    if req.attempts >= MAX_ATTEMPTS:
                        tally.graveyard += 1
                    else:
                        dlq.put(req)
        finally:
            conn.close()

    threads = []
    gen_tally = Tally()
    tallies.append(gen_tally)
    threads.append(threading.Thread(target=generator, args=(gen_tally,), daemon=True))
    threads.append(threading.Thread(target=dlq_manager, daemon=True))
    for key in spec.keys:
        t = Tally()
        tallies.append(t)
        threads.append(threading.Thread(target=worker, args=(key, t), daemon=True))
    for thread in threads:
        thread.start()
    time.sleep(spec.duration_s)
    stop.set()  # workers finish the send in hand (1 s timeout), then leave
    deadline = time.monotonic() + DRAIN_S + 1.0
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    total = Tally()
    for t in tallies:
        total.merge(t)
    return total
