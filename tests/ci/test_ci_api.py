"""The CI API client against APIs served from 127.0.0.1: retries, rate limits, pagination, the deadline."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ci.run import ci_api
from ci.rollback import history
from tests.helpers.fake_ci import TOKEN, Reply

ROOT = Path(__file__).resolve().parents[2]
BUILD = "/organizations/acme/pipelines/tts/builds/42"


@pytest.fixture
def github(api, monkeypatch):
    base, routes = api
    monkeypatch.setenv("LANEKEEPER_GITHUB_API", base)
    monkeypatch.setenv("LANEKEEPER_BUILDKITE_API", base)
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("BUILDKITE_API_TOKEN", TOKEN)
    ci_api.set_deadline(30)
    return base, routes


def test_server_errors_are_retried(github, monkeypatch):
    base, routes = github
    monkeypatch.setattr(time, "sleep", lambda s: None)
    answers = iter([Reply(503), Reply(502), {"ok": True}])
    routes["/thing"] = lambda query, payload: next(answers)
    assert ci_api.get_json("github", f"{base}/thing") == {"ok": True}
    assert len(routes.seen) == 3


def test_retry_after_is_honoured(github, monkeypatch):
    base, routes = github
    waits, sleep, me = [], time.sleep, threading.current_thread()
    # only this thread's waits: under pytest -n a session-scoped engine may share this process, sleeping in its threads
    monkeypatch.setattr(time, "sleep", lambda s: waits.append(s) if threading.current_thread() is me else sleep(s))
    answers = iter([Reply(429, headers={"Retry-After": "2"}), Reply(503, headers={"Retry-After": "soon"}),
                    {"ok": True}])
    routes["/thing"] = lambda query, payload: next(answers)
    assert ci_api.get_json("github", f"{base}/thing") == {"ok": True}
    assert waits == [2.0, 2.0]      # a Retry-After that is no number or date falls back to backoff


def test_a_rate_limit_is_called_a_rate_limit(github):
    base, routes = github
    reset = int(time.time()) + 3600
    routes["/thing"] = Reply(403, headers={"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)})
    with pytest.raises(ci_api.CIAPIError, match=r"rate limit reached \(HTTP 403\).*wait 3\d\d\ds") as err:
        ci_api.get_json("github", f"{base}/thing")
    assert "refused the token" not in str(err.value) and len(routes.seen) == 1   # no point retrying past the deadline


def test_link_pagination_is_followed(github):
    base, routes = github
    runs = "/repos/acme/tts/actions/runs/9/jobs"

    def page(query, payload):
        if "page=2" in query:
            return Reply(body=json.dumps({"jobs": [{"name": "b", "conclusion": "failure"}]}).encode())
        return Reply(headers={"Link": f'<{base}{runs}?filter=all&per_page=100&page=2>; rel="next"'},
                     body=json.dumps({"jobs": [{"name": "a", "conclusion": "success"}]}).encode())

    routes[runs] = page
    routes["/repos/acme/tts/actions/workflows/lanes.yml/runs"] = {"workflow_runs": [
        {"id": 9, "run_number": 5, "head_sha": "abc", "head_branch": "main"}]}
    (build,) = history.from_github("acme/tts", "lanes.yml")
    assert {name: r[0].state for name, r in build.lanes.items()} == {"a": "passed", "b": "failed"}


def test_a_trickling_api_ends_at_the_deadline(api, tmp_path):
    """The build answers a byte every 0.2 s (about a minute in all): repro gives up at its 2 s deadline."""
    base, routes = api
    body = json.dumps({"number": 42, "jobs": [{"id": "j1", "name": "x", "state": "failed"}] * 6}).encode()
    routes[BUILD] = Reply(body=body, trickle=0.2)
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "ci.cli", "repro", "--buildkite",
                          "https://buildkite.com/acme/tts/builds/42", "--dry-run", "--api-deadline", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "LANEKEEPER_BUILDKITE_API": base, "BUILDKITE_API_TOKEN": TOKEN})
    elapsed = time.monotonic() - t0
    assert run.returncode == 2, run.stderr
    assert "no complete answer within the 2s deadline" in run.stderr and "--api-deadline" in run.stderr
    assert elapsed < 20 and "Traceback" not in run.stderr
