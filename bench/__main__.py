"""``python -m bench``: see bench/run.py and docs/benchmarks.md."""

import sys

from bench.run import main

sys.exit(main())
