"""A GPU runner's plumbing, the top layer: how a session runs a stage (``stages``), the workflows' trust checks
and job summaries, the per-session summaries, and ``gpu_gate``, the whole GPU verdict in one command (the
machine itself, its GPUs and processes, is ``ci.host``)."""
