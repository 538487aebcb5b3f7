"""`lanekeeper` command line.

Every user error (bad profile, bad flag, bad input file) ends in one line on
stderr and exit status 2, the same as argparse's own usage errors, so that CI
can tell "you asked for something wrong" (2) from "the lane is red" (1).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from ci.argtypes import port, seconds, whole_number
from engine.config import check_file, dump_yaml, resolve
from engine.errors import EngineError, UserError
from engine.profile_schema import BACKENDS, PLATFORMS


class _Backend(argparse.Action):
    """`--backend vllm` is `--set backend=vllm`, in its place among the other overrides."""

    def __call__(self, parser, namespace, value, option_string=None):
        namespace.overrides = [*namespace.overrides, f"backend={value}"]


def _profile_args(p: argparse.ArgumentParser, profile_default: str | None = "qwen3_tts") -> None:
    if profile_default is not None:
        p.add_argument("--profile", default=profile_default, help="profile name or path (default: %(default)s)")
    p.add_argument("--platform", choices=PLATFORMS, help="platform section to apply (default: detected)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a resolved value, e.g. stages.0.enforce_eager=true (repeatable)")
    p.add_argument("--backend", choices=BACKENDS, action=_Backend,
                   help="stage-0 backend: torch (built-in talker) or vllm (codebook 0 on vLLM)")


def cmd_profile_show(args) -> int:
    prof = resolve(args.name, platform=args.platform, overrides=args.overrides)
    if args.json:
        data = prof.explain() if args.explain else prof.to_dict()
        print(json.dumps(data, indent=2))
    elif args.explain:
        width = max(len(k) for k in prof.flat())
        print(f"# {prof.name} on {prof.platform}")
        for key, item in prof.explain().items():
            print(f"{key:<{width}}  {json.dumps(item['value']):<12}  # {item['source']}")
    else:
        print(f"# {prof.name} resolved for {prof.platform}")
        print(dump_yaml(prof.to_dict()), end="")
    return 0


def cmd_profile_check(args) -> int:
    from engine.config import PROFILES_DIR
    from engine.pins import profile_names

    paths = args.paths or [str(PROFILES_DIR / f"{name}.yaml") for name in profile_names(PROFILES_DIR)]
    bad = 0
    for path in paths:
        errors = check_file(path)
        for err in errors:
            print(err, file=sys.stderr)
        bad += bool(errors)
        if not errors:
            print(f"ok  {path}")
    return 2 if bad else 0


def cmd_profile_pin(args) -> int:
    from pathlib import Path

    from engine import pins

    if not Path(args.profiles_dir).is_dir() or not pins.profile_names(args.profiles_dir):
        raise UserError(f"--profiles-dir {args.profiles_dir}: no directory of profiles (*.yaml) there")
    if args.check:
        drift = pins.drift(args.profiles_dir)
        if drift:
            print("\n".join(drift))
            print(f"lanekeeper: the pins differ from the profiles; run `{pins.COMMAND}` and commit the result",
                  file=sys.stderr)
            return 1
        print(f"ok  {args.profiles_dir}/{pins.PINS_FILE} matches every profile on every platform")
        return 0
    unknown = sorted(set(args.names) - set(pins.profile_names(args.profiles_dir)))
    if unknown:
        raise UserError(f"no such profile in {args.profiles_dir}: {', '.join(unknown)} "
                         f"(known: {', '.join(pins.profile_names(args.profiles_dir))})")
    changed = pins.write(args.profiles_dir, args.names or None)
    print(f"pinned {', '.join(changed)}" if changed else "pins already current")
    return 0


def cmd_serve(args) -> int:
    import faulthandler
    import os

    from engine.procs import STACK_DIR_ENV, STACK_DUMP_SIGNAL, stack_file
    from engine.server import serve

    stack_dir = os.environ.get(STACK_DIR_ENV)
    if stack_dir and os.path.isdir(stack_dir):
        faulthandler.register(STACK_DUMP_SIGNAL, file=open(stack_file(stack_dir, os.getpid()), "w"), all_threads=True)

    from engine.supervisor import RestartPolicy

    profile = resolve(args.profile, platform=args.platform, overrides=args.overrides)
    policy = RestartPolicy(max_restarts=args.max_restarts, window_s=args.restart_window)
    return serve(profile, host=args.host, port=args.port, allowed_local_media_path=args.allowed_local_media_path,
                 policy=policy)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lanekeeper")
    except PackageNotFoundError:   # run from a checkout that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lanekeeper", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    profile = sub.add_parser("profile", help="resolve and validate deploy profiles")
    psub = profile.add_subparsers(dest="profile_command", required=True)
    show = psub.add_parser("show", help="print a resolved profile")
    show.add_argument("name", help="profile name (profiles/NAME.yaml) or path")
    _profile_args(show, profile_default=None)
    show.add_argument("--json", action="store_true", help="print JSON")
    show.add_argument("--explain", action="store_true", help="add where each value came from")
    show.set_defaults(func=cmd_profile_show)
    check = psub.add_parser("check", help="validate profiles on every platform")
    check.add_argument("paths", nargs="*", help="profile files (default: every profile)")
    check.set_defaults(func=cmd_profile_check)
    from engine.config import PROFILES_DIR

    pin = psub.add_parser("pin", help="regenerate profiles/pins.yaml from the profiles")
    pin.add_argument("names", nargs="*", help="only these profiles (default: every profile)")
    pin.add_argument("--check", action="store_true", help="change nothing; print the drift as a diff, exit 1 on drift")
    pin.add_argument("--profiles-dir", default=str(PROFILES_DIR), help="default: %(default)s")
    pin.set_defaults(func=cmd_profile_pin)

    from ci import synth

    synth.add_parser(sub, _profile_args)

    serve = sub.add_parser("serve", help="serve the OpenAI-compatible speech API")
    _profile_args(serve)
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

    from ci import lane_commands, rollback_commands

    lane_commands.add_parsers(sub)
    rollback_commands.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from ci import ci_api

    try:
        if hasattr(args, "api_deadline"):   # one deadline for all of this command's API calls
            ci_api.set_deadline(args.api_deadline)
        return args.func(args)
    except UserError as e:
        print(f"lanekeeper: error: {e}", file=sys.stderr)
        return 2
    except EngineError as e:
        print(f"lanekeeper: engine failed: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`lanekeeper ... | head`): stop quietly, and keep Python's exit-time
        # flush of stdout from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def entry() -> int:
    """The `lanekeeper` program.  Only here does ^C or SIGTERM become exit status 130: `main()` lets
    KeyboardInterrupt through, so a caller in the same process (a test, the pytest plugin turning
    SIGTERM into an interrupt) sees its own interrupt instead of a return value."""
    try:
        return main()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(entry())
