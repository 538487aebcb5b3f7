"""Read CI runs through the Buildkite and GitHub REST APIs.

Tokens come from BUILDKITE_API_TOKEN / GITHUB_TOKEN and are only ever sent in the
Authorization header, to the API's own host: httpx drops the header when a redirect leaves
that origin (artifact downloads answer 302 to an object store that refuses a second auth
mechanism), and no message, log or exception here contains a token.  API roots can be
pointed elsewhere (LANEKEEPER_BUILDKITE_API, LANEKEEPER_GITHUB_API), which the tests use
to serve API-shaped responses from 127.0.0.1.

Every command that talks to an API has one overall deadline (`--api-deadline`, default
60 s, or LANEKEEPER_API_DEADLINE): retries of 429 and 5xx answers (with backoff, honouring
Retry-After), pagination and a body that trickles in all count against it.
"""
from __future__ import annotations

import email.utils
import io
import json
import os
import re
import time
import zipfile

import httpx

from engine.errors import UserError

DEFAULT_DEADLINE = 60.0
RETRIES = 4
_deadline: tuple[float, float] | None = None     # (seconds allowed, monotonic time they run out)


class CIAPIError(UserError):
    pass


def set_deadline(seconds: float | None) -> None:
    """Start the command's API deadline now (None: LANEKEEPER_API_DEADLINE or the default)."""
    global _deadline
    if seconds is None:
        text = os.environ.get("LANEKEEPER_API_DEADLINE", str(DEFAULT_DEADLINE))
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if not 0 < seconds < float("inf"):
            _deadline = (DEFAULT_DEADLINE, time.monotonic() + DEFAULT_DEADLINE)
            raise CIAPIError(f"LANEKEEPER_API_DEADLINE must be a positive number of seconds, got {text!r}")
    _deadline = (seconds, time.monotonic() + seconds)


def _left() -> float:
    if _deadline is None:
        set_deadline(None)
    return _deadline[1] - time.monotonic()


def _root(kind: str) -> str:
    if kind == "buildkite":
        return os.environ.get("LANEKEEPER_BUILDKITE_API", "https://api.buildkite.com/v2").rstrip("/")
    return os.environ.get("LANEKEEPER_GITHUB_API", "https://api.github.com").rstrip("/")


def _token(kind: str) -> str:
    name = "BUILDKITE_API_TOKEN" if kind == "buildkite" else "GITHUB_TOKEN"
    token = os.environ.get(name)
    if not token:
        raise CIAPIError(f"{name} is not set; it is needed to read the {kind} API")
    return token


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds the server asks us to wait (Retry-After, or GitHub's rate-limit reset), if it says."""
    value = response.headers.get("retry-after")
    if value:
        if value.strip().isdigit():
            return float(value)
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):   # a Retry-After that is neither seconds nor a date: no hint
            return None
        return max(0.0, when.timestamp() - time.time())
    reset = response.headers.get("x-ratelimit-reset")
    if reset and reset.isdigit() and response.headers.get("x-ratelimit-remaining") == "0":
        return max(0.0, int(reset) - time.time())
    return None


def _rate_limited(response: httpx.Response) -> bool:
    return response.status_code == 429 or (response.status_code == 403
                                            and response.headers.get("x-ratelimit-remaining") == "0")


def _send(kind: str, method: str, url: str, headers: dict, body: dict | None) -> tuple[httpx.Response, bytes]:
    """One request, the body read in full, all within the deadline."""
    left = _left()
    with httpx.Client(follow_redirects=True, timeout=httpx.Timeout(min(30.0, max(left, 0.1)))) as client:
        with client.stream(method, url, headers=headers, json=body) as response:
            chunks = []
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                if _left() <= 0:
                    raise _out_of_time(kind, url)
            return response, b"".join(chunks)


def _out_of_time(kind: str, url: str) -> CIAPIError:
    return CIAPIError(f"{kind} API: no complete answer within the {_deadline[0]:g}s deadline for {url} "
                      f"(raise it with --api-deadline)")


def request(kind: str, url: str, accept: str = "application/json",
            data: dict | None = None) -> tuple[bytes, httpx.Response]:
    """GET (or, with `data`, POST as JSON); retries 429 and 5xx within the deadline."""
    headers = {"Authorization": f"Bearer {_token(kind)}", "Accept": accept, "User-Agent": "lanekeeper"}
    if kind == "github":
        headers["X-GitHub-Api-Version"] = "2022-11-28"
    method = "POST" if data is not None else "GET"
    for attempt in range(RETRIES + 1):
        if _left() <= 0:
            raise _out_of_time(kind, url)
        try:
            response, body = _send(kind, method, url, headers, data)
        except httpx.TimeoutException:
            if _left() <= 0:
                raise _out_of_time(kind, url) from None
            if attempt == RETRIES:
                raise CIAPIError(f"{kind} API timed out {RETRIES + 1} times for {url}") from None
            continue
        except httpx.HTTPError as e:
            raise CIAPIError(f"cannot reach the {kind} API at {url}: {type(e).__name__}: {e}") from None
        code = response.status_code
        if code < 400:
            return body, response
        wait = _retry_after(response)
        if _rate_limited(response) or code >= 500:
            what = "rate limited" if _rate_limited(response) else f"HTTP {code}"
            pause = wait if wait is not None else min(2.0 ** attempt, 30.0)
            if attempt < RETRIES and pause < _left():
                time.sleep(pause)
                continue
            if _rate_limited(response):
                after = f"; it asks to wait {wait:.0f}s" if wait is not None else ""
                raise CIAPIError(f"{kind} API rate limit reached (HTTP {code}) for {url}{after}")
            raise CIAPIError(f"{kind} API error {what} for {url}, {attempt + 1} attempt(s)")
        if code in (401, 403):
            raise CIAPIError(f"{kind} API refused the token (HTTP {code}) for {url}")
        if code == 404:
            raise CIAPIError(f"{kind} API: not found (HTTP 404): {url}")
        raise CIAPIError(f"{kind} API error HTTP {code} for {url}")
    raise AssertionError("unreachable")


def get(kind: str, url: str, accept: str = "application/json", data: dict | None = None) -> bytes:
    return request(kind, url, accept, data)[0]


def _json(kind: str, url: str, body: bytes):
    try:
        return json.loads(body)
    except ValueError:
        raise CIAPIError(f"{kind} API returned something that is not JSON for {url}") from None


def get_json(kind: str, url: str):
    return _json(kind, url, get(kind, url))


def paged(kind: str, url: str, key: str | None = None, pages: int = 10) -> list:
    """Every item of a listing, following the `Link: <...>; rel="next"` headers (at most `pages`)."""
    items: list = []
    sep = "&" if "?" in url else "?"
    next_url: str | None = f"{url}{sep}per_page=100"
    for _ in range(pages):
        body, response = request(kind, next_url)
        data = _json(kind, next_url, body)
        items += data.get(key, []) if key else data
        next_url = response.links.get("next", {}).get("url")
        if not next_url:
            break
    return items


BK_BUILD = re.compile(r"^https?://[^/]+/(?P<org>[^/]+)/(?P<pipeline>[^/]+)/builds/(?P<number>\d+)")
GH_RUN = re.compile(r"^https?://[^/]+/(?P<owner>[^/]+)/(?P<repo>[^/]+)/actions/runs/(?P<run>\d+)")


def buildkite_junits(build_url: str, job_label: str | None = None,
                     shard: tuple[int, int] | None = None) -> dict[str, bytes]:
    """The junit.xml artifacts of a build's failed jobs, or of the jobs labelled `job_label`; with `shard`
    (K, N), only those of parallel job K of N (a sharded lane's jobs share one label)."""
    m = BK_BUILD.match(build_url)
    if not m:
        raise CIAPIError(f"not a Buildkite build URL: {build_url!r} (expected https://buildkite.com/ORG/PIPELINE/builds/N)")
    base = f"{_root('buildkite')}/organizations/{m['org']}/pipelines/{m['pipeline']}/builds/{m['number']}"
    build = get_json("buildkite", base)
    jobs = [j for j in build.get("jobs", []) if j.get("type", "script") == "script"]
    if job_label is not None:
        jobs = [j for j in jobs if job_label in (j.get("name"), j.get("label"), j.get("step_key"))]
        if not jobs:
            raise CIAPIError(f"build {m['number']} has no job labelled {job_label!r}")
    else:
        jobs = [j for j in jobs if j.get("state") in ("failed", "timed_out", "broken")]
    if shard is not None:
        jobs = [j for j in jobs if j.get("parallel_group_index") == shard[0] - 1
                and j.get("parallel_group_total", shard[1]) == shard[1]]
        if not jobs:
            raise CIAPIError(f"build {m['number']} has no " + ("" if job_label else "failed ")
                             + f"parallel job {shard[0]} of {shard[1]}" + (f" labelled {job_label!r}" if job_label else ""))
    found = {}
    for job in jobs:
        for art in paged("buildkite", f"{base}/jobs/{job['id']}/artifacts"):
            if art.get("path", art.get("filename", "")).endswith("junit.xml"):
                found[f"{job.get('name')}: {art['path']}"] = get("buildkite", art["download_url"], "*/*")
    if not found:
        raise CIAPIError(f"no junit.xml artifact in build {m['number']}" + (f" job {job_label!r}" if job_label else ""))
    return found


def github_junits(run_url: str, artifact: str | None = None, shard_dir: str | None = None) -> dict[str, bytes]:
    """The junit.xml files in a run's artifacts, or in the one named `artifact`; with `shard_dir`, only in
    artifacts named for that shard (KEY-shard-K-of-N)."""
    m = GH_RUN.match(run_url)
    if not m:
        raise CIAPIError(f"not a GitHub Actions run URL: {run_url!r} (expected https://github.com/OWNER/REPO/actions/runs/ID)")
    url = f"{_root('github')}/repos/{m['owner']}/{m['repo']}/actions/runs/{m['run']}/artifacts"
    found = {}
    for art in paged("github", url, key="artifacts"):
        if artifact is not None and art.get("name") != artifact:
            continue
        if shard_dir is not None and not str(art.get("name", "")).endswith(f"-{shard_dir}"):
            continue
        blob = get("github", art["archive_download_url"], "application/vnd.github+json")
        try:
            with zipfile.ZipFile(io.BytesIO(blob)) as z:
                for name in z.namelist():
                    if name.endswith("junit.xml"):
                        found[f"{art['name']}: {name}"] = z.read(name)
        except zipfile.BadZipFile:
            raise CIAPIError(f"artifact {art.get('name')!r} of run {m['run']} is not a zip archive") from None
    if not found:
        raise CIAPIError(f"no junit.xml in the artifacts of run {m['run']}")
    return found
