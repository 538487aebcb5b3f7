"""`python -m engine.serve ARGS` is `lanekeeper serve ARGS`: what the server fixture starts."""
import argparse
import sys

from engine.serve.commands import add_serve_parser, run_command


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.serve")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    try:
        return run_command(parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)]))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
