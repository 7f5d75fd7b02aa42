"""Learn2PD recipe (Bao et al. 2025, "Learning to Parallel"): ``python -m recipes.learn2pd.<script>``."""
