"""Features: lessons that extend the core through its registries (LoRA, grammars, pooling...)."""
