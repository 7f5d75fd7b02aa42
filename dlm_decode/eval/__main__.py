"""``python -m dlm_decode.eval [lm-eval arguments]``: the same as ``dlm-decode eval``."""

import sys

from dlm_decode.eval.cli import main

if __name__ == "__main__":
    sys.exit(main())
