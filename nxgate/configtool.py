"""``nxgate-config``: check a configuration file, or print every option."""

from __future__ import annotations

import argparse
import sys

from nxgate import config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nxgate-config", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="validate a configuration file")
    check.add_argument("file")
    commands.add_parser("defaults", help="print every option with its default")
    args = parser.parse_args(argv)
    if args.command == "defaults":
        print(config.describe())
        return 0
    try:
        config.load(args.file)
    except config.ConfigError as error:
        print(error, file=sys.stderr)
        return 1
    print(f"{args.file}: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
