"""Concurrency, client disconnects and SIGTERM: nothing leaks, nothing is left running."""
import asyncio
import http.client
import os
import threading
import time
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
from openai import AsyncOpenAI

from engine.serve.launcher import RemoteServer
from tests.helpers.online import metrics, wait_for

pytestmark = pytest.mark.online


def successes(srv) -> float:
    return metrics(srv).get(("lanekeeper_requests_total", (("status", "success"),)), 0.0)


def released(srv) -> bool:
    m = metrics(srv)
    return (m[("lanekeeper_requests_in_flight", ())] == 0
            and m.get(("lanekeeper_stage_queue_depth", (("stage", "0"),)), 0) == 0
            and m.get(("lanekeeper_stage_queue_depth", (("stage", "1"),)), 0) == 0)


@pytest.fixture(scope="module")
def srv(platform):
    with RemoteServer(["--platform", platform]) as s:
        yield s


def test_an_idle_connection_outlasts_a_clients_keepalive(srv):
    """httpx, and so the openai client, reuses an idle connection for up to 5 s: the server must not close one
    sooner, or a request sent as it closes fails with a reset."""
    conn = http.client.HTTPConnection(urlsplit(srv.url).netloc, timeout=30)
    try:
        for pause in (0, httpx.Limits().keepalive_expiry + 1):
            time.sleep(pause)
            conn.request("GET", "/health")
            response = conn.getresponse()
            response.read()
            assert response.status == 200 and not response.will_close
    finally:
        conn.close()


def test_64_concurrent_streams(srv):
    before = successes(srv)

    async def one(client, i):
        async with client.audio.speech.with_streaming_response.create(
                model="qwen3-tts", input=f"Concurrent request number {i}.", voice="vivian", response_format="pcm",
                extra_body={"stream": True, "seed": i}) as resp:
            return b"".join([chunk async for chunk in resp.iter_bytes()])

    async def all64():
        client = AsyncOpenAI(base_url=srv.url + "/v1", api_key="EMPTY", max_retries=0, timeout=300,
                             http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=100), timeout=300))
        try:
            return await asyncio.gather(*(one(client, i) for i in range(64)))
        finally:
            await client.close()

    bodies = asyncio.run(all64())
    assert len(bodies) == 64 and all(len(b) > 0 and len(b) % 2 == 0 for b in bodies)
    assert wait_for(lambda: successes(srv) - before == 64, 5), successes(srv) - before
    assert wait_for(lambda: released(srv), 5), metrics(srv)
    # where the stages' time went, as the serving benchmark reads it
    m = metrics(srv)
    seconds = {(dict(labels)["stage"], dict(labels)["part"]): v for (name, labels), v in m.items()
               if name == "lanekeeper_stage_seconds"}
    assert set(seconds) == {("0", "decode"), ("0", "admit"), ("0", "readback"), ("0", "handoff"), ("0", "inbox"),
                            ("1", "decode"), ("1", "readback")}
    assert all(v > 0 for v in seconds.values()), seconds
    windows, passes = m[("lanekeeper_code2wav_windows", ())], m[("lanekeeper_code2wav_passes", ())]
    assert windows >= 64 and 0 < passes <= windows, (windows, passes)
    held, run = (m[("lanekeeper_code2wav_frames", (("of", of),))] for of in ("windows", "passes"))
    assert run >= held >= windows, (run, held, windows)   # every window has a frame; padding only adds


def test_disconnect_mid_stream_releases_request(srv):
    cancelled = lambda: metrics(srv).get(("lanekeeper_requests_total", (("status", "cancelled"),)), 0.0)
    before = cancelled()
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", srv.url + "/v1/audio/speech",
                           json={"input": "A very long text. " * 80, "response_format": "pcm", "stream": True}) as r:
            assert r.status_code == 200
            chunks = r.iter_bytes()
            next(chunks)
            assert metrics(srv)[("lanekeeper_requests_in_flight", ())] == 1
            assert wait_for(lambda: metrics(srv).get(("lanekeeper_stage_queue_depth", (("stage", "0"),)), 0) == 1, 3)
    # the client is gone; the engine must drop the request long before it would have finished (~2000 frames)
    assert wait_for(lambda: released(srv), 5), metrics(srv)
    assert cancelled() == before + 1
    r = httpx.post(srv.url + "/v1/audio/speech", json={"input": "After the disconnect."}, timeout=60)
    assert r.status_code == 200


def test_request_refused_by_stage_gets_a_status(srv):
    r = httpx.post(srv.url + "/v1/audio/speech", timeout=60,
                   json={"input": "x" * 4000, "response_format": "pcm", "stream": True})
    assert r.status_code == 400 and "max_model_len" in r.json()["error"]["message"]


def test_sigterm_finishes_in_flight_then_ends_every_process(platform, tmp_path):
    """Status 0 as documented, after the process's own exit handlers ran: its temporary folders (the
    fork server's socket among them) are gone with it."""
    with RemoteServer(["--platform", platform], env={"TMPDIR": str(tmp_path)}) as server:
        pids = server.pids()
        assert len(pids) >= 3   # server + two stages
        got = {}

        def request():
            with httpx.stream("POST", server.url + "/v1/audio/speech", timeout=60,
                              json={"input": "Finish me before you go. " * 6, "response_format": "pcm",
                                    "stream": True}) as r:
                got["status"] = r.status_code
                got["bytes"] = b"".join(r.iter_bytes())

        t = threading.Thread(target=request)
        t.start()
        assert wait_for(lambda: metrics(server)[("lanekeeper_requests_in_flight", ())] == 1, 10)
        code = server.terminate(timeout=60)
        t.join(30)
        assert code == 0, server.log_tail()
        assert not list(tmp_path.iterdir())
        assert "Application shutdown complete" in server.log_tail()
        assert "leaked" not in server.log_tail()
        assert got["status"] == 200 and len(got["bytes"]) == (round(len("Finish me before you go. " * 6) * 0.8) + 2) * 3840
        assert wait_for(lambda: not [p for p in pids if psutil.pid_exists(p)
                                     and psutil.Process(p).status() != psutil.STATUS_ZOMBIE], 10)


def test_sigkill_of_the_server_mid_request_ends_every_stage(platform):
    """The owner dies without a word (kill -9) mid-stream, with many seconds of the request still to make:
    its stages and their resource tracker follow within 5 s instead of running on."""
    import signal

    with RemoteServer(["--platform", platform]) as server:
        tree = psutil.Process(server.proc.pid).children(recursive=True)
        assert len(tree) >= 2
        started = threading.Event()

        def request():
            try:
                with httpx.stream("POST", server.url + "/v1/audio/speech", timeout=60,
                                  json={"input": "Cut me off halfway. " * 120, "response_format": "pcm",
                                        "stream": True}) as r:
                    for _ in r.iter_bytes():
                        started.set()
            except httpx.HTTPError:
                pass   # the server is gone: that is the point

        t = threading.Thread(target=request)
        t.start()
        assert started.wait(30), server.log_tail()
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
        _, alive = psutil.wait_procs(tree, timeout=5)
        t.join(30)
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], \
            [(p.pid, p.name()) for p in alive]
        assert os.listdir(server.tmp)   # what the killed server could not remove (its fork server's socket)
    assert not os.path.exists(server.tmp)   # the launcher removes it
