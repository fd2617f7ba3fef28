"""``python -m sharedstream`` is the ``sharedstream`` command."""

import sys

from sharedstream.cli import main

sys.exit(main())
