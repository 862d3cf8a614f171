"""`make field`: the field drills live in inferop_devtools.field; this is their entry point."""

import sys

from inferop_devtools.field.cli import main

sys.exit(main())
