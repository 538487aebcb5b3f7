"""Greedy agreement between runners and graph modes: the same requests through runner v1 eager (the
reference path) and each other (runner, graphs) combination, on one device and dtype.

    python benchmarks/gpu_parity.py --platform cuda --preset 0.6b --dtype bfloat16 --batch 16

On CPU in float32 the codes are identical (the test suite holds that).  In bf16 on a GPU,
batched kernels round differently from unbatched ones, and one flipped argmax changes
every frame after it; this prints how far the codes agree: whole requests, and frames
up to each request's first difference.  The last row is runner v2 with graphs on the eager
kernels (engine/models/kernels/ off): fused against unfused on the same requests.
"""
from __future__ import annotations

import argparse
import contextlib

import numpy as np

from engine.models import kernels
from engine.profile.resolve import resolve
from engine.stage.messages import Codes
from engine.request import SpeechRequest
from engine.stage0.process import make_talker
from offline_matrix import model_args   # this script's folder is on sys.path when run


class Inbox(list):
    put = list.append


def greedy_codes(args, runner: str, eager: bool, requests) -> dict[str, np.ndarray]:
    profile = resolve("qwen3_tts", platform=args.platform, overrides=[
        f"model_runner={runner}", f"model.preset={args.preset}", f"model.dtype={args.dtype}",
        f"stages.0.max_num_seqs={args.batch}", f"stages.0.enforce_eager={str(eager).lower()}",
        "stages.0.max_model_len=1024"])
    out = Inbox()
    talker = make_talker(profile, Inbox(), out)
    for r in requests:
        talker.add(r)
    while talker.busy:
        talker.step()
    return {m.request_id: m.codes for m in out if isinstance(m, Codes)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_args(ap)
    args = ap.parse_args()
    requests = [SpeechRequest(f"Parity sentence number {i} " + "x" * (i % 5) * 7, temperature=0.0, seed=i)
                for i in range(args.batch)]
    ref = greedy_codes(args, "v1", True, requests)
    print(f"{args.preset} {args.dtype} on {args.platform}, {len(requests)} greedy requests, against runner v1 eager\n")
    print("| runner | graphs | kernels | identical requests | frames before first difference | identical codes |")
    print("| --- | --- | --- | --- | --- | --- |")
    for runner, eager, fused in (("v1", False, True), ("v2", True, True), ("v2", False, True), ("v2", False, False)):
        with contextlib.nullcontext() if fused else kernels.unfused():
            got = greedy_codes(args, runner, eager, requests)
        same = agree = total = codes_same = codes_total = 0
        for rid, want in ref.items():
            have = got[rid]
            n = min(len(want), len(have))
            diff = np.nonzero((want[:n] != have[:n]).any(1))[0]
            first = int(diff[0]) if len(diff) else n
            same += int(len(want) == len(have) and first == n)
            agree += first
            total += len(want)
            codes_same += int((want[:n] == have[:n]).sum())
            codes_total += want.size
        print(f"| {runner} | {'off' if eager else 'on'} | {'fused' if fused else 'eager'} | {same}/{len(ref)} | {agree}/{total} "
              f"({100 * agree / total:.0f} %) | {100 * codes_same / codes_total:.1f} % |", flush=True)


if __name__ == "__main__":
    main()
