"""``python -m sharedstream`` is the ``sharedstream`` command."""

import sys

from sharedstream.runtime.cli import main

sys.exit(main())
