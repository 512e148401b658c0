#!/usr/bin/env python
"""Django's command-line utility; ``effect-broker`` is the same thing installed."""

import sys

from effect_broker.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
