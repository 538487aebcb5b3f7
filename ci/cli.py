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

from engine.profile.resolve import check_file, dump_yaml, resolve
from engine.errors import UserError, did_you_mean
from engine.profile.location import ROOT_ENV, profile_source
from engine.serve.commands import add_parsers as add_engine_parsers, profile_args, run_command


def cmd_profile_show(args) -> int:
    prof = resolve(args.name, platform=args.platform, overrides=args.overrides)
    if args.json:
        data = prof.explain() if args.explain else prof.to_dict()
        print(json.dumps(data, indent=2))
    elif args.explain:
        width = max(len(k) for k in prof.flat())
        print(f"# {prof.name} on {prof.platform} from {prof.path} ({profile_source().origin})")
        for key, item in prof.explain().items():
            print(f"{key:<{width}}  {json.dumps(item['value']):<12}  # {item['source']}")
    else:
        print(f"# {prof.name} resolved for {prof.platform} from {prof.path} ({profile_source().origin})")
        print(dump_yaml(prof.to_dict()), end="")
    return 0


def cmd_profile_check(args) -> int:
    from engine.profile.location import profiles_dir
    from engine.profile.pins import profile_names

    directory = profiles_dir()
    paths = args.paths or [str(directory / f"{name}.yaml") for name in profile_names(directory)]
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

    from engine.profile import pins

    if args.profiles_dir is None:
        from engine.profile.location import profiles_dir

        args.profiles_dir = str(profiles_dir())
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
    known = pins.profile_names(args.profiles_dir)
    unknown = sorted(set(args.names) - set(known))
    if unknown:
        raise UserError(f"no such profile in {args.profiles_dir}: {', '.join(unknown)}"
                        f"{did_you_mean(unknown[0], known)} (known: {', '.join(known)})")
    changed = pins.write(args.profiles_dir, args.names or None)
    print(f"pinned {', '.join(changed)}" if changed else "pins already current")
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lanekeeper")
    except PackageNotFoundError:   # run from a checkout that was never installed
        return "(not installed)"


class Parser(argparse.ArgumentParser):
    """argparse, with its usage errors in one line like every other user error (subcommands inherit it)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="lanekeeper", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--root", metavar="DIR", help="the checkout to act on (default: the nearest one at or above "
                                                      "the working directory)")
    sub = parser.add_subparsers(dest="command", required=True)

    profile = sub.add_parser("profile", help="resolve and validate deploy profiles")
    psub = profile.add_subparsers(dest="profile_command", required=True)
    show = psub.add_parser("show", help="print a resolved profile")
    show.add_argument("name", help="profile name (profiles/NAME.yaml) or path")
    profile_args(show, profile_default=None)
    show.add_argument("--json", action="store_true", help="print JSON")
    show.add_argument("--explain", action="store_true", help="add where each value came from")
    show.set_defaults(func=cmd_profile_show)
    check = psub.add_parser("check", help="validate profiles on every platform")
    check.add_argument("paths", nargs="*", help="profile files (default: every profile)")
    check.set_defaults(func=cmd_profile_check)
    pin = psub.add_parser("pin", help="regenerate profiles/pins.yaml from the profiles")
    pin.add_argument("names", nargs="*", help="only these profiles (default: every profile)")
    pin.add_argument("--check", action="store_true", help="change nothing; print the drift as a diff, exit 1 on drift")
    pin.add_argument("--profiles-dir", default=None, help="default: the checkout's profiles/")
    pin.set_defaults(func=cmd_profile_pin)

    add_engine_parsers(sub)

    from ci.run import commands as lane_commands
    from ci.rollback import commands as rollback_commands

    lane_commands.add_parsers(sub)
    rollback_commands.add_parsers(sub)
    return parser


PASSES_TO_PYTEST = ("run", "repro")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []   # `run LANE -- -x -k foo`: pytest's
    args = parser.parse_args(argv[:len(argv) - len(rest) - 1] if "--" in argv else argv)
    if "--" in argv and args.command not in PASSES_TO_PYTEST:
        parser.error(f"only {' and '.join(PASSES_TO_PYTEST)} pass arguments after -- (to pytest); "
                     f"{args.command} takes none")
    args.pytest_args = rest
    if args.root:   # the environment carries it to the lane's pytest and the servers it starts
        os.environ[ROOT_ENV] = os.path.abspath(args.root)
    from ci.run import ci_api

    if hasattr(args, "api_deadline"):   # one deadline for all of this command's API calls, from its start
        command = args.func

        def with_deadline(a):
            ci_api.set_deadline(a.api_deadline)
            return command(a)

        args.func = with_deadline
    return run_command(args)


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
