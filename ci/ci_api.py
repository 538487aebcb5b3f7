"""Read CI runs through the Buildkite and GitHub REST APIs.

Tokens come from BUILDKITE_API_TOKEN / GITHUB_TOKEN and are only ever sent in the
Authorization header: no message, log or exception here contains one.  API roots can
be pointed elsewhere (LANEKEEPER_BUILDKITE_API, LANEKEEPER_GITHUB_API), which the tests
use to serve API-shaped responses from 127.0.0.1.
"""
from __future__ import annotations

import io
import json
import os
import re
import urllib.error
import urllib.request
import zipfile


class CIAPIError(Exception):
    pass


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


def get(kind: str, url: str, accept: str = "application/json", data: dict | None = None) -> bytes:
    """GET (or, with `data`, POST as JSON)."""
    headers = {"Authorization": f"Bearer {_token(kind)}", "Accept": accept, "User-Agent": "lanekeeper"}
    if kind == "github":
        headers["X-GitHub-Api-Version"] = "2022-11-28"
    body = None
    if data is not None:
        body = json.dumps(data).encode()
        headers["Content-Type"] = "application/json"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=30) as r:
            return r.read()
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise CIAPIError(f"{kind} API refused the token (HTTP {e.code}) for {url}") from None
        if e.code == 404:
            raise CIAPIError(f"{kind} API: not found (HTTP 404): {url}") from None
        raise CIAPIError(f"{kind} API error HTTP {e.code} for {url}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise CIAPIError(f"cannot reach the {kind} API at {url}: {reason}") from None


def get_json(kind: str, url: str):
    body = get(kind, url)
    try:
        return json.loads(body)
    except ValueError:
        raise CIAPIError(f"{kind} API returned something that is not JSON for {url}") from None


def paged(kind: str, url: str, key: str | None = None, pages: int = 10) -> list:
    """Follow `page=` pagination until a short or empty page."""
    items = []
    for page in range(1, pages + 1):
        sep = "&" if "?" in url else "?"
        data = get_json(kind, f"{url}{sep}per_page=100&page={page}")
        chunk = data.get(key, []) if key else data
        items += chunk
        if len(chunk) < 100:
            break
    return items


BK_BUILD = re.compile(r"^https?://[^/]+/(?P<org>[^/]+)/(?P<pipeline>[^/]+)/builds/(?P<number>\d+)")
GH_RUN = re.compile(r"^https?://[^/]+/(?P<owner>[^/]+)/(?P<repo>[^/]+)/actions/runs/(?P<run>\d+)")


def buildkite_junits(build_url: str, job_label: str | None = None) -> dict[str, bytes]:
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
    found = {}
    for job in jobs:
        for art in get_json("buildkite", f"{base}/jobs/{job['id']}/artifacts"):
            if art.get("path", art.get("filename", "")).endswith("junit.xml"):
                found[f"{job.get('name')}: {art['path']}"] = get("buildkite", art["download_url"], "*/*")
    if not found:
        raise CIAPIError(f"no junit.xml artifact in build {m['number']}" + (f" job {job_label!r}" if job_label else ""))
    return found


def github_junits(run_url: str, artifact: str | None = None) -> dict[str, bytes]:
    m = GH_RUN.match(run_url)
    if not m:
        raise CIAPIError(f"not a GitHub Actions run URL: {run_url!r} (expected https://github.com/OWNER/REPO/actions/runs/ID)")
    url = f"{_root('github')}/repos/{m['owner']}/{m['repo']}/actions/runs/{m['run']}/artifacts"
    found = {}
    for art in get_json("github", url).get("artifacts", []):
        if artifact is not None and art.get("name") != artifact:
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
