"""`python -m engine.serve ARGS` is `lanekeeper serve ARGS`: what the server fixture starts."""
import argparse
import sys

from engine.errors import EngineError, UserError
from engine.serve.commands import add_serve_parser


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.serve")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except UserError as e:
        print(f"lanekeeper: error: {e}", file=sys.stderr)
        return 2
    except EngineError as e:
        print(f"lanekeeper: engine failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
