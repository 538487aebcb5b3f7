"""Soak: N minutes of mixed traffic against `lanekeeper serve` while stages are SIGKILLed.

    python benchmarks/soak.py --minutes 10 --concurrency 32 --kill-every 30

Each of the concurrent clients loops until time is up, picking a request at random:
a whole WAV/PCM response, an SSE stream, a raw PCM stream, a hostile body (values out of
range, bytes that are not UTF-8, JSON nested past any parser, a megabyte of instructions),
or a raw stream it walks away from after the first chunk.  Meanwhile a random stage of
the current engine is SIGKILLed every --kill-every seconds (with jitter).

Every request must end one way or another the client can see: complete audio (its
length checked against the engine's frame count for the text), an error body or SSE
error event with a diagnosis, a 4xx for the hostile ones, or, for a raw stream, a
transfer cut off without its last chunk.  Anything else (a timeout, a dropped
connection, audio that ends cleanly but short) is counted as lost.  Orphans are
processes of a replaced engine still alive 15 s after its replacement, plus anything
of the server's left after its SIGTERM.  Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import signal
import time
from collections import Counter

import httpx
import psutil

from engine.serve.launcher import RemoteServer
from engine.models.presets import SAMPLES_PER_FRAME
from engine.models.tokenizer import frames_for_text
from engine.process.tree import unwind_on_sigterm

TEXTS = ["Short reply.", "The talker emits one codec frame per step.",
         "A medium length sentence for the soak test, spoken at an even pace.",
         "Stage one decodes frames into audio with left context, chunk by chunk, as they arrive from stage zero."]
HOSTILE = [
    {"json": {"input": "Hi.", "seed": 2**64}},
    {"json": {"input": "Hi.", "temperature": 1e30}},
    {"json": {"input": "Hi.", "max_new_tokens": 10**12}},
    {"json": {"input": "Hi.", "task_type": "VoiceDesign", "instructions": "x" * 2**20}},
    {"json": {"input": "Hi.", "voice": "nobody"}},
    {"json": {"input": "Hi.", "task_type": "Base", "ref_text": "r", "ref_audio": "data:audio/wav;base64,@@"}},
    {"content": b'{"input": "\xff\xfe"}'},
    {"content": b"[" * 100_000 + b"]" * 100_000},
    {"content": b'{"input": "Hi.", "temperature": NaN}'},
]
KINDS = ["whole"] * 4 + ["sse"] * 2 + ["raw"] + ["hostile"] * 2 + ["disconnect"]


def expected_bytes(text: str) -> int:
    return frames_for_text(text) * SAMPLES_PER_FRAME * 2


def has_diagnosis(body: dict) -> bool:
    err = body.get("error") if isinstance(body, dict) else None
    return isinstance(err, dict) and bool(err.get("message")) and bool(err.get("code") or err.get("param"))


class Soak:
    def __init__(self, srv: RemoteServer, minutes: float, concurrency: int, kill_every: float, seed: int):
        self.srv, self.url = srv, srv.url + "/v1/audio/speech"
        self.deadline = time.monotonic() + 60 * minutes
        self.concurrency, self.kill_every = concurrency, kill_every
        self.rng = random.Random(seed)
        self.outcomes: Counter = Counter()
        self.lost: list[str] = []
        self.latencies: list[float] = []
        self.kills = 0
        self.replaced: list[tuple[float, list[int]]] = []   # (when, pids of the engine that was killed)

    def stages(self) -> list[psutil.Process]:
        try:
            kids = psutil.Process(self.srv.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        out = []
        for p in kids:
            try:
                if p.name()[:2] == "lk":
                    out.append(p)
            except psutil.Error:
                pass
        return out

    async def killer(self) -> None:
        while time.monotonic() < self.deadline - 5:
            await asyncio.sleep(self.kill_every * self.rng.uniform(0.5, 1.5))
            if time.monotonic() >= self.deadline - 5:
                return
            stages = self.stages()
            if not stages:
                continue
            tree = []
            for s in stages:
                try:
                    tree += [s.pid] + [c.pid for c in s.children(recursive=True)]
                except psutil.Error:
                    tree.append(s.pid)
            victim = self.rng.choice(stages)
            try:
                os.kill(victim.pid, signal.SIGKILL)
                self.kills += 1
                self.replaced.append((time.monotonic(), tree))
            except ProcessLookupError:
                pass

    def lose(self, kind: str, why: str) -> None:
        self.outcomes["lost"] += 1
        self.lost.append(f"{kind}: {why}")

    async def one(self, client: httpx.AsyncClient, i: int) -> float:
        """One request; returns how long this client should wait before its next (a 503's Retry-After)."""
        kind = self.rng.choice(KINDS)
        text = self.rng.choice(TEXTS)
        body = {"input": text, "voice": "vivian", "seed": i, "response_format": "pcm"}
        t0 = time.monotonic()
        try:
            if kind == "whole":
                r = await client.post(self.url, json=body)
                if r.status_code == 200:
                    if len(r.content) != expected_bytes(text):
                        return self.lose(kind, f"{len(r.content)} bytes, expected {expected_bytes(text)}")
                    self.served(t0)
                elif has_diagnosis(r.json()):
                    return self.failed(r)
                else:
                    self.lose(kind, f"{r.status_code} without a diagnosis: {r.text[:200]}")
            elif kind == "hostile":
                r = await client.post(self.url, **self.rng.choice(HOSTILE),
                                      headers={"content-type": "application/json"})
                if 400 <= r.status_code < 500 and has_diagnosis(r.json()):
                    self.outcomes["refused as invalid (4xx)"] += 1
                else:
                    self.lose(kind, f"hostile body answered {r.status_code}: {r.text[:200]}")
            elif kind == "sse":
                return await self.sse(client, {**body, "stream": True, "stream_format": "sse"}, text, t0)
            else:
                return await self.raw(client, {**body, "stream": True}, text, t0, walk_away=kind == "disconnect")
        except httpx.TimeoutException as e:
            self.lose(kind, f"timeout: {e!r}")
        except httpx.TransportError as e:
            self.lose(kind, f"transport error: {e!r}")

    def served(self, t0: float) -> None:
        self.outcomes["served (complete audio)"] += 1
        self.latencies.append(time.monotonic() - t0)

    def failed(self, r: httpx.Response) -> float:
        """A request failed with a diagnosis; a client honours Retry-After, as a real one would."""
        self.outcomes["failed with a diagnosis"] += 1
        try:
            return float(r.headers.get("retry-after", 0))
        except ValueError:
            return 0.0

    async def refused(self, r: httpx.Response, kind: str) -> float | None:
        """A stream refused before it began: its error body must say why."""
        await r.aread()
        if has_diagnosis(r.json()):
            return self.failed(r)
        else:
            self.lose(kind, f"{r.status_code} without a diagnosis")

    async def sse(self, client, body, text, t0) -> float | None:
        async with client.stream("POST", self.url, json=body) as r:
            if r.status_code != 200:
                return await self.refused(r, "sse")
            size, last = 0, None
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                last = json.loads(line[5:])
                if last["type"] == "speech.audio.delta":
                    size += len(base64.b64decode(last["audio"]))
        if last and last["type"] == "speech.audio.done" and size == expected_bytes(text):
            self.served(t0)
        elif last and last["type"] == "speech.audio.error" and has_diagnosis(last):
            self.outcomes["failed with a diagnosis"] += 1
        else:
            self.lose("sse", f"ended with {last and last['type']} after {size} bytes")

    async def raw(self, client, body, text, t0, walk_away: bool) -> float | None:
        try:
            async with client.stream("POST", self.url, json=body) as r:
                if r.status_code != 200:
                    return await self.refused(r, "raw")
                size = 0
                async for chunk in r.aiter_bytes():
                    size += len(chunk)
                    if walk_away and size:
                        self.outcomes["client disconnects mid-stream"] += 1
                        return
        except httpx.RemoteProtocolError:
            self.outcomes["raw streams cut off (error id in the server log)"] += 1
            return
        if walk_away:   # finished before the first chunk could be walked away from
            self.outcomes["client disconnects mid-stream"] += 1
        elif size == expected_bytes(text):
            self.served(t0)
        else:
            self.lose("raw", f"clean end after {size} of {expected_bytes(text)} bytes")

    async def client_loop(self, client, start: int) -> None:
        i = start
        while time.monotonic() < self.deadline:
            wait = await self.one(client, i)
            if wait:
                await asyncio.sleep(wait)
            i += self.concurrency

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=self.concurrency + 8)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            killer = asyncio.create_task(self.killer())
            await asyncio.gather(*(self.client_loop(client, k) for k in range(self.concurrency)))
            killer.cancel()

    def orphans_of_replaced(self) -> list[int]:
        out = []
        for when, pids in self.replaced:
            time.sleep(max(0.0, when + 15 - time.monotonic()))
            out += [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        return out


def server_counts(srv) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(httpx.get(srv.url + "/metrics").text):
        for s in fam.samples:
            if s.name == "lanekeeper_requests_total":
                out[s.labels["status"]] = int(s.value)
            elif s.name == "lanekeeper_engine_restarts_total":
                out["restarts"] = int(s.value)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--kill-every", type=float, default=30.0, help="seconds between stage SIGKILLs, on average")
    ap.add_argument("--platform", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    unwind_on_sigterm()   # stopped early, what this started ends with it
    extra = ["--max-restarts", "1000000", "--restart-window", "60"]
    for o in args.overrides:
        extra += ["--set", o]
    srv = RemoteServer(["--platform", args.platform, *extra])
    everything: set[int] = set()
    try:
        everything.update(srv.pids())
        soak = Soak(srv, args.minutes, args.concurrency, args.kill_every, args.seed)
        t0 = time.monotonic()
        asyncio.run(soak.run())
        wall = time.monotonic() - t0
        orphans = soak.orphans_of_replaced()
        counted = server_counts(srv)
        everything.update(srv.pids())
        code = srv.terminate(timeout=60)
    finally:
        srv.kill()
    time.sleep(2)
    left = [p for p in everything if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    sent = sum(soak.outcomes.values())
    lat = sorted(soak.latencies)
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")
    rows = [("duration", f"{wall / 60:.1f} min at concurrency {args.concurrency}"),
            ("requests sent", sent),
            *[(k, soak.outcomes[k]) for k in ("served (complete audio)", "failed with a diagnosis",
                                               "refused as invalid (4xx)",
                                               "raw streams cut off (error id in the server log)",
                                               "client disconnects mid-stream")],
            ("**lost** (no audio, no error)", soak.outcomes["lost"]),
            ("stage SIGKILLs", soak.kills),
            ("engine restarts (server's /metrics)", counted.get("restarts", 0)),
            ("**orphan processes**", len(set(orphans) | set(left))),
            ("latency p50 / p99, served (s)", f"{pct(0.5):.2f} / {pct(0.99):.2f}"),
            ("server's request count (success/error/cancelled/rejected)",
             f"{sum(v for k, v in counted.items() if k != 'restarts')} "
             f"({counted.get('success', 0)}/{counted.get('error', 0)}/{counted.get('cancelled', 0)}/"
             f"{counted.get('rejected', 0)})"),
            ("server exit status after SIGTERM", code)]
    print("| soak | value |\n| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value} |")
    for why in soak.lost[:20]:
        print(f"lost: {why}")
    return 1 if soak.outcomes["lost"] or orphans or left else 0


if __name__ == "__main__":
    raise SystemExit(main())
