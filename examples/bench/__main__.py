"""``python -m examples.bench [options]`` is ``effect-broker bench [options]``."""

from __future__ import annotations

import sys

from effect_broker.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
