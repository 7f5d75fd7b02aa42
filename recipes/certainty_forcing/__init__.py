"""Certainty-forcing distillation (dParallel, Chen et al. 2025, "dParallel: Learnable Parallel Decoding for dLLMs").

A recipe, not part of the installed package (``python -m recipes.certainty_forcing.<script>`` from the repository
root): ``trajectories.py`` decodes training prompts one token per step with the
base model and keeps the verified answers, ``train.py`` fine-tunes (LoRA or full) with complementary masking and the
certainty-forcing loss, ``evaluate.py`` measures score and NFE with the ``entropy_threshold`` decoder before and after.
The pieces (``masking``, ``losses``, ``lora``) are importable as ``recipes.certainty_forcing.*``.
"""

import os

# shared cores: idle OpenMP threads sleep instead of spinning (see recipes/train_demo); set before torch loads
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
