"""`python -m inferencepool.observability --write [ROOT]`: regenerate the chart's monitoring files and
deploy/monitoring/ under ROOT (the repository root, default the current directory)."""

from __future__ import annotations

import argparse
from pathlib import Path

from inferencepool.observability import chart


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m inferencepool.observability")
    parser.add_argument("--write", metavar="ROOT", type=Path, nargs="?", const=Path("."), required=True)
    args = parser.parse_args()
    for path in chart.write(args.write):
        print(path)


if __name__ == "__main__":
    main()
