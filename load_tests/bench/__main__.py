"""`python -m load_tests.bench`: the benchmark's command (`cli.main`)."""

import sys

from load_tests.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
