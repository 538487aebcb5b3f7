"""The engine's commands, `serve` and `synth`, and the profile arguments every engine command takes.
`lanekeeper` mounts them; `python -m engine.serve` runs `serve` on its own."""
from __future__ import annotations

import argparse
import os
import sys

from engine.errors import EngineError, UserError
from engine.profile.schema import BACKENDS, PLATFORMS
from engine.serve import synth
from engine.serve.argtypes import port, seconds, whole_number


class _Backend(argparse.Action):
    """`--backend vllm` is `--set backend=vllm`, in its place among the other overrides."""

    def __call__(self, parser, namespace, value, option_string=None):
        namespace.overrides = [*namespace.overrides, f"backend={value}"]


def profile_args(p: argparse.ArgumentParser, profile_default: str | None = "qwen3_tts") -> None:
    if profile_default is not None:
        p.add_argument("--profile", default=profile_default, help="profile name or path (default: %(default)s)")
    p.add_argument("--platform", choices=PLATFORMS, help="platform section to apply (default: detected)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a resolved value, e.g. stages.0.enforce_eager=true (repeatable)")
    p.add_argument("--backend", choices=BACKENDS, action=_Backend,
                   help="stage-0 backend: torch (built-in talker) or vllm (codebook 0 on vLLM)")


def engine_args(p: argparse.ArgumentParser) -> None:
    profile_args(p)
    p.add_argument("--cpu-fallback", action="store_true",
                   help="run on the CPU when the platform's device is missing here (default: refuse to start)")


def cmd_serve(args) -> int:
    from engine.process.stacks import dump_stacks_on_signal
    from engine.process.tree import SERVER_TITLE, name_process
    from engine.profile.resolve import resolve
    from engine.runtime.supervisor import RestartPolicy
    from engine.serve.server import serve

    name_process(SERVER_TITLE)   # how stack dumps and leak checks know it
    dump_stacks_on_signal()
    profile = resolve(args.profile, platform=args.platform, overrides=args.overrides)
    policy = RestartPolicy(max_restarts=args.max_restarts, window_s=args.restart_window)
    return serve(profile, host=args.host, port=args.port, allowed_local_media_path=args.allowed_local_media_path,
                 policy=policy, cpu_fallback=args.cpu_fallback)


def add_serve_parser(sub) -> None:
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible speech API")
    engine_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    serve.add_argument("--port", type=port, default=8000, help="port to listen on (default: %(default)s)")
    serve.add_argument("--allowed-local-media-path", metavar="DIR",
                       help="directory that file:// ref_audio paths may read from")
    serve.add_argument("--max-restarts", type=whole_number(0), default=5, metavar="N",
                       help="engine restarts allowed within --restart-window; one more and the server exits "
                            "with status 4 (default: %(default)s)")
    serve.add_argument("--restart-window", type=seconds, default=300.0, metavar="SECONDS",
                       help="the window --max-restarts counts over (default: %(default)s)")
    serve.set_defaults(func=cmd_serve)


def add_parsers(sub) -> None:
    synth.add_parser(sub, engine_args)
    add_serve_parser(sub)


def run_command(args) -> int:
    """Run a parsed command as every lanekeeper command ends: a user error is one line and status 2 (as
    argparse's own usage errors), a failed engine one line and status 1, so that CI can tell "you
    asked for something wrong" from "it broke"."""
    try:
        return args.func(args)
    except UserError as e:
        print(f"lanekeeper: error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 2)
    except EngineError as e:
        print(f"lanekeeper: engine failed: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`lanekeeper ... | head`): stop quietly, and keep Python's exit-time
        # flush of stdout from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
