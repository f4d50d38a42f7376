"""The Marlin MoE kernel subject: model shapes, weight and activation formats, the block-size rule as
specified, the inputs and calls of both Marlin paths, the kernel bench (``python -m ci.kernel.bench``) and
its measured error rates. ``subject`` registers the results kind ``kernel-bench`` with the core."""
