"""`make drills`: the reliability and security drills live in inferop_devtools.drills; this is their entry point."""

import sys

from inferop_devtools.drills.cli import main

sys.exit(main())
