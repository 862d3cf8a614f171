"""`make bench`: the benchmarks live in inferop_devtools.bench; this is their entry point."""

import sys

from inferop_devtools.bench.cli import main

sys.exit(main())
