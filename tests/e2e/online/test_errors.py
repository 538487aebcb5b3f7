"""Every bad request gets OpenAI-shaped error JSON with the right status, and the server keeps serving."""
import base64
import os

import httpx
import numpy as np
import pytest
import soundfile as sf

from engine.serve.launcher import RemoteServer

pytestmark = pytest.mark.online


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    allowed = root / "allowed"
    allowed.mkdir()
    sf.write(allowed / "ref.wav", (0.1 * np.sin(np.arange(12000) / 5)).astype(np.float32), 24000)
    sf.write(root / "secret.wav", np.zeros(2400, np.float32), 24000)
    os.symlink(root / "secret.wav", allowed / "escape.wav")
    return root, allowed


@pytest.fixture(scope="module")
def srv(media, platform):
    with RemoteServer(["--platform", platform, "--allowed-local-media-path", str(media[1])]) as s:
        yield s


def _post(srv, **kw):
    return httpx.post(srv.url + "/v1/audio/speech", timeout=60, **kw)


def _ok(srv):
    r = _post(srv, json={"input": "Still serving.", "voice": "vivian", "response_format": "pcm"})
    assert r.status_code == 200 and len(r.content) > 0


BASE = {"input": "Hello.", "voice": "vivian"}
CLONE = {"input": "Hello.", "task_type": "Base", "ref_text": "A reference."}


def _cases(allowed):
    return {
        "unknown_voice": ({**BASE, "voice": "nobody"}, 400, "voice", "unknown voice"),
        "unsupported_format": ({**BASE, "response_format": "mp3"}, 400, "response_format", "not supported"),
        "invalid_format": ({**BASE, "response_format": "ogg"}, 400, "response_format", "response_format"),
        "stream_not_streamable": ({**BASE, "response_format": "flac", "stream": True}, 400, "response_format",
                                  "streaming needs"),
        "empty_input": ({**BASE, "input": "   "}, 400, "input", "empty"),
        "oversized_input": ({**BASE, "input": "x" * 5000}, 400, "input", "at most 4096"),
        "speed": ({**BASE, "speed": 1.5}, 400, "speed", "speed"),
        "unknown_model": ({**BASE, "model": "whisper"}, 404, "model", "does not exist"),
        "unknown_field": ({**BASE, "colour": "blue"}, 400, "colour", "unknown field"),
        "bad_base64": ({**CLONE, "ref_audio": "data:audio/wav;base64,@@@not-base64@@@"}, 400, "ref_audio",
                       "not valid base64"),
        "undecodable_audio": ({**CLONE, "ref_audio": "data:audio/wav;base64," + base64.b64encode(b"RIFFjunk").decode()},
                              400, "ref_audio", "not decodable audio"),
        "path_dotdot": ({**CLONE, "ref_audio": f"file://{allowed}/../secret.wav"}, 403, "ref_audio",
                        "outside the allowed"),
        "path_symlink": ({**CLONE, "ref_audio": f"file://{allowed}/escape.wav"}, 403, "ref_audio",
                         "outside the allowed"),
        "path_absolute": ({**CLONE, "ref_audio": "file:///etc/passwd"}, 403, "ref_audio", "outside the allowed"),
        "missing_ref": ({**CLONE}, 400, "ref_audio", "needs ref_audio"),
        # values a stage could not honour: refused here, naming the field, and the stages live on
        "seed_past_64_bits": ({**BASE, "seed": 2**64}, 400, "seed", "less than or equal to"),
        "negative_seed": ({**BASE, "seed": -1}, 400, "seed", "greater than or equal to 0"),
        "huge_temperature": ({**BASE, "temperature": 1e30}, 400, "temperature", "less than or equal to 10"),
        "huge_max_new_tokens": ({**BASE, "max_new_tokens": 10**12}, 400, "max_new_tokens", "less than or equal"),
        "megabyte_instructions": ({"input": "Hi.", "task_type": "VoiceDesign", "instructions": "x" * 2**20}, 400,
                                  "instructions", "at most 4096 characters"),
        "megabyte_ref_text": ({**CLONE, "ref_text": "x" * 2**20}, 400, "ref_text", "at most 4096 characters"),
    }


CASE_NAMES = sorted(_cases("/x"))


@pytest.mark.parametrize("case", CASE_NAMES)
def test_bad_request(case, srv, media):
    body, status, param, message = _cases(media[1])[case]
    r = _post(srv, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert message in err["message"]
    _ok(srv)


BAD_BODIES = {
    "not_json": (b"{not json", "not valid JSON"),
    "array": (b"[1, 2]", "must be a JSON object, not list"),
    "empty": (b"", "not valid JSON"),
    "not_utf8": (b'{"input": "\xff\xfe"}', "not UTF-8: byte 0xff at offset 11"),
    "deep_array": (b"[" * 200_000 + b"]" * 200_000, "nests too deeply"),
    "deep_in_a_field": (b'{"input": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_001, "nests too deeply"),
    "infinity": (b'{"input": "Hi.", "temperature": Infinity}', "temperature: "),
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_bad_json(case, srv):
    payload, message = BAD_BODIES[case]
    r = _post(srv, content=payload, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert message in err["message"], err
    _ok(srv)


def test_framework_errors_are_openai_shaped(srv):
    for method, path, status, code in [("GET", "/v1/nothing", 404, "not_found"),
                                       ("GET", "/v1/audio/speech", 405, "method_not_allowed"),
                                       ("DELETE", "/health", 405, "method_not_allowed")]:
        r = httpx.request(method, srv.url + path)
        assert r.status_code == status and r.json()["error"]["code"] == code, r.text
        assert path in r.json()["error"]["message"]
    r = _post(srv, content=b"x" * (33 * 2**20), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large", r.text
    _ok(srv)


def test_metrics_count_every_request(srv, media):
    """Refused at parse time, refused by validation, refused by the stage, served: each counted exactly once."""
    from tests.helpers.online import metrics

    def totals():
        m = metrics(srv)
        return {s: m.get(("lanekeeper_requests_total", (("status", s),)), 0.0)
                for s in ("success", "error", "cancelled", "rejected")}

    before = totals()
    for payload, _ in BAD_BODIES.values():
        _post(srv, content=payload, headers={"content-type": "application/json"})
    for body, *_ in _cases(media[1]).values():
        _post(srv, json=body)
    _post(srv, json={"input": "x" * 4000, "response_format": "pcm"})   # longer than the stage's max_model_len
    _ok(srv)
    after = totals()
    sent = len(BAD_BODIES) + len(_cases(media[1])) + 2
    assert sum(after.values()) - sum(before.values()) == sent, (before, after)
    assert after["rejected"] - before["rejected"] == sent - 1 and after["success"] - before["success"] == 1


def test_allowed_local_file(srv, media):
    r = _post(srv, json={**CLONE, "ref_audio": f"file://{media[1]}/ref.wav", "response_format": "wav"})
    assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"


def test_local_files_off_by_default(server, platform):
    r = httpx.post(server.url + "/v1/audio/speech", json={**CLONE, "ref_audio": "file:///etc/hostname"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "local_media_disabled"


def test_models_and_health(srv):
    assert httpx.get(srv.url + "/health").json() == {"status": "ok", "restarts": 0}
    assert [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]] == ["qwen3-tts"]
