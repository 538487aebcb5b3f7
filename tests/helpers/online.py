"""Talking to a speech server in tests: the openai client, decoded audio, its metrics."""
import base64
import io
import time

import httpx
import numpy as np
import soundfile as sf
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families


def client_for(srv) -> OpenAI:
    return OpenAI(base_url=srv.url + "/v1", api_key="EMPTY", max_retries=0, timeout=120)


def decode(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    """int16 samples and sample rate, whatever the container."""
    if fmt == "pcm":
        audio, sr = sf.read(io.BytesIO(data), format="RAW", samplerate=24000, channels=1, subtype="PCM_16",
                            dtype="int16")
    else:
        audio, sr = sf.read(io.BytesIO(data), dtype="int16")
    return audio, sr


def data_url(audio: np.ndarray, sr: int = 24000) -> str:
    buf = io.BytesIO()
    sf.write(buf, audio, sr, format="WAV")
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()


def metrics(srv) -> dict[tuple, float]:
    out = {}
    for fam in text_string_to_metric_families(httpx.get(srv.url + "/metrics").text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def wait_for(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False
