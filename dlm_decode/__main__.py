"""``python -m dlm_decode ...``: the ``dlm-decode`` command line (``dlm_decode.cli``) without the installed script."""

import sys

from dlm_decode.cli import main

sys.exit(main())
