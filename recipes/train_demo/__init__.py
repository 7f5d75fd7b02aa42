"""The demo models' training recipe: ``python -m recipes.train_demo.train --config CONFIG.yaml``."""

import os

# idle OpenMP threads sleep instead of spinning: on a shared 2-core machine spinning threads of concurrent jobs made a
# 2-thread step several times slower (1.8 s with 1 thread against 6 s with 2 spinning ones). Set here, before any
# module of the recipe imports torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
