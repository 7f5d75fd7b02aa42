"""``python -m dlm_decode.eval [lm-eval arguments]``: the same as ``dlm-decode eval``."""

import sys

from dlm_decode.eval.cli import main

if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, FileNotFoundError) as e:  # bad model_args, missing checkpoint or data: one line, exit 2
        print(f"dlm-decode eval: error: {e}", file=sys.stderr)
        sys.exit(2)
