"""`python -m pearl`: see pearl/cli.py."""

import sys

from pearl.cli import main

sys.exit(main())
