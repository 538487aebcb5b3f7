"""The server survives what an operator meets: a request that trips a bug in a stage, a stage killed or
frozen mid-request, a handoff that comes late, and a fault that keeps coming back.  Every client case
goes through the official `openai` client; every server's processes are gone afterwards."""
import os
import signal
import threading
import time

import httpx
import openai
import psutil
import pytest
from openai import OpenAI

from ci.matrix import TEST_WATCHDOG
from engine.serve.launcher import RemoteServer
from tests.helpers.online import metrics, wait_for

pytestmark = pytest.mark.online

SHORT = "Short one."                  # 10 frames
LONG = "A much longer request that makes many frames. " * 3   # well past 40 frames


def _server(platform, *args, **kw) -> RemoteServer:
    sets = []
    for o in TEST_WATCHDOG:
        sets += ["--set", o]
    return RemoteServer(["--platform", platform, *sets, *args], **kw)


def _client(srv) -> OpenAI:
    return OpenAI(base_url=srv.url + "/v1", api_key="EMPTY", max_retries=0, timeout=60)


def _speak(client, text, **extra):
    return client.audio.speech.create(model="qwen3-tts", input=text, voice="vivian", response_format="pcm",
                                      extra_body=extra or None)


def _stages(srv) -> dict[int, psutil.Process]:
    """The engine's stage processes, by stage id (their process names are lk0:…, lk1:…)."""
    out = {}
    for p in psutil.Process(srv.proc.pid).children(recursive=True):
        try:
            name = p.name()
        except psutil.Error:
            continue
        if name[:2] == "lk" and name[2:3].isdigit():
            out[int(name[2])] = p
    return out


def _gone(procs, timeout=10) -> bool:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return all(p.status() == psutil.STATUS_ZOMBIE for p in alive if p.is_running())


def _count(srv, name, **labels) -> float:
    return metrics(srv).get((name, tuple(sorted(labels.items()))), 0.0)


def _health_sequence(srv, until, timeout=60) -> list[tuple[int, str]]:
    """Distinct (status code, health status) seen, polling until `until` is seen after a 503."""
    seen: list[tuple[int, str]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = httpx.get(srv.url + "/health", timeout=5)
            now = (r.status_code, r.json().get("status"))
        except httpx.HTTPError:
            now = (0, "unreachable")
        if not seen or seen[-1] != now:
            seen.append(now)
        if now == until and any(code == 503 for code, _ in seen):
            break
        time.sleep(0.05)
    return seen


@pytest.mark.parametrize("stage", [0, 1])
def test_a_request_that_raises_in_a_stage_fails_alone(stage, platform):
    """One request trips an exception in a stage: it fails with a diagnosis and an error id, the traceback goes
    to the server log only, and the same stage processes serve the next request."""
    with _server(platform, "--set", f"faults=raise_stage:stage={stage},after_frames=30") as srv:
        client = _client(srv)
        pids = {s: p.pid for s, p in _stages(srv).items()}
        with pytest.raises(openai.InternalServerError) as err:
            _speak(client, LONG)
        body = err.value.body
        assert body["code"] == "StageError" and body["diagnosis"]["stage"] == stage, body
        assert "Traceback" not in str(body) and "/engine/" not in str(body) and "traceback" not in body["diagnosis"]
        assert body["id"] in body["message"]
        log = srv.log_tail(400)
        assert body["id"] in log and "Traceback" in log and "injected fault raise_stage" in log
        assert len(_speak(client, SHORT).content) == 10 * 3840
        assert {s: p.pid for s, p in _stages(srv).items()} == pids
        assert httpx.get(srv.url + "/health").json()["status"] == "ok"
        assert _count(srv, "lanekeeper_engine_restarts_total") == 0
        assert _count(srv, "lanekeeper_requests_total", status="error") == 1


def test_killed_stage_fails_in_flight_requests_then_the_engine_restarts(platform):
    """kill -9 of stage 1 mid-request: the non-streamed request gets 503 with the diagnosis, the SSE stream an
    error event, and the raw audio stream is cut off so that the client raises instead of ending cleanly.
    /health says restarting, then ok; the restart is counted; the old stages are gone."""
    with _server(platform) as srv:
        client = _client(srv)
        old = _stages(srv)
        results: dict[str, object] = {}
        streaming, sse_streaming = threading.Event(), threading.Event()

        def raw():
            try:
                with client.audio.speech.with_streaming_response.create(
                        model="qwen3-tts", input=LONG * 6, voice="vivian", response_format="pcm",
                        extra_body={"stream": True}) as resp:
                    got = 0
                    for chunk in resp.iter_bytes():
                        got += len(chunk)
                        streaming.set()
                    results["raw"] = ("ended cleanly", got)
            except Exception as e:   # what the client raises is the point
                results["raw"] = e

        def sse():
            with client.audio.speech.with_streaming_response.create(
                    model="qwen3-tts", input=LONG * 6, voice="vivian", response_format="pcm",
                    stream_format="sse") as resp:
                for line in resp.iter_lines():
                    if line.startswith("data:"):
                        results["sse"] = line
                        sse_streaming.set()

        def whole():
            try:
                results["whole"] = _speak(client, LONG * 6)
            except openai.APIStatusError as e:
                results["whole"] = e

        threads = [threading.Thread(target=f) for f in (raw, sse, whole)]
        for t in threads:
            t.start()
        assert streaming.wait(60) and sse_streaming.wait(60), srv.log_tail()
        os.kill(old[1].pid, signal.SIGKILL)
        for t in threads:
            t.join(60)
        # the client's HTTP layer reports a transfer that ended without its last chunk
        assert type(results["raw"]).__name__ == "RemoteProtocolError", results["raw"]
        assert "incomplete chunked read" in str(results["raw"])
        assert '"speech.audio.error"' in results["sse"] and '"StageDied"' in results["sse"]
        whole_err = results["whole"]
        assert isinstance(whole_err, openai.APIStatusError) and whole_err.status_code == 503, whole_err
        assert whole_err.body["code"] == "StageDied" and whole_err.body["diagnosis"]["stage"] == 1

        seen = _health_sequence(srv, (200, "ok"))
        assert (503, "restarting") in seen and seen[-1] == (200, "ok"), seen
        assert _gone(list(old.values()))
        assert len(_speak(client, SHORT).content) == 10 * 3840
        assert _count(srv, "lanekeeper_engine_restarts_total") == 1
        assert _count(srv, "lanekeeper_requests_in_flight") == 0
        assert _count(srv, "lanekeeper_requests_total", status="error") == 3
        assert "cut off after" in srv.log_tail(400)


def test_frozen_stage_turns_health_503_then_the_engine_restarts(platform):
    """SIGSTOP of stage 0: within its deadline /health answers 503 naming the stage, requests get the same
    reason, and the supervisor replaces the frozen engine."""
    with _server(platform, "--set", "watchdog.stage_deadline_s=3") as srv:
        old = _stages(srv)
        os.kill(old[0].pid, signal.SIGSTOP)
        try:
            assert wait_for(lambda: srv.health() == 503, 15), srv.log_tail()
            r = httpx.get(srv.url + "/health")
            body = r.json()
            assert body["status"] in ("unhealthy", "restarting"), body
            assert "stage 0 (talker)" in body["reason"] and "heartbeat" in body["reason"], body
            seen = _health_sequence(srv, (200, "ok"))
            assert seen[-1] == (200, "ok"), seen
        finally:
            try:
                os.kill(old[0].pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        assert _gone(list(old.values()))
        assert len(_speak(_client(srv), SHORT).content) == 10 * 3840
        assert _count(srv, "lanekeeper_engine_restarts_total") == 1


def test_a_fault_that_keeps_coming_back_ends_the_server_non_zero(platform):
    """Every request kills stage 1.  Past --max-restarts in the window the server reports unhealthy and exits
    with status 4, so that an orchestrator replaces it, and leaves no process behind."""
    with _server(platform, "--set", "faults=kill_stage:stage=1,after_frames=1", "--max-restarts", "1",
                 "--restart-window", "300") as srv:
        client = _client(srv)
        tree = [psutil.Process(srv.proc.pid)] + psutil.Process(srv.proc.pid).children(recursive=True)
        with pytest.raises(openai.APIStatusError) as first:
            _speak(client, SHORT)
        assert first.value.status_code == 503 and first.value.body["code"] == "StageDied"
        assert _health_sequence(srv, (200, "ok"))[-1] == (200, "ok")
        tree += psutil.Process(srv.proc.pid).children(recursive=True)
        with pytest.raises(openai.APIStatusError) as second:
            _speak(client, SHORT)
        assert second.value.body["diagnosis"]["stage"] == 1
        assert srv.proc.wait(60) == 4, srv.log_tail()
        assert "giving up" in srv.log_tail(200)
        assert _gone(tree)


def test_a_late_handoff_is_a_handoff_stall_not_a_stalled_stage(platform):
    """Stage 0 takes longer than the handoff deadline to deliver a window.  The request fails as a handoff
    stall on stage 0's side, and the engine is not restarted: nothing is dead or stuck."""
    with _server(platform, "--set", "faults=delay_handoff:ms=4000", "--set", "watchdog.handoff_deadline_s=1.5",
                 "--set", "watchdog.stage_deadline_s=30") as srv:
        with pytest.raises(openai.InternalServerError) as err:
            _speak(_client(srv), SHORT)
        body = err.value.body
        assert body["code"] == "StageHandoffStall" and body["diagnosis"]["stage"] == 0, body
        assert "handing off" in body["message"]
        assert httpx.get(srv.url + "/health").json()["status"] == "ok"
        assert _count(srv, "lanekeeper_engine_restarts_total") == 0
