"""The Marlin MoE kernel subject: weight and activation formats, the inputs and calls of both Marlin paths, the
kernel bench (``python -m ci.kernel.bench``), its measured error rates, and the tile sweep and oracle. The shapes,
routing and the rule as specified are shared with the other MoE subjects (``ci.moe``). ``subject`` registers the
results kind ``kernel-bench`` with the core."""
