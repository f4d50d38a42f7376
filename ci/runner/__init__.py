"""A GPU runner's plumbing: the GPU (presence, fingerprint, state while measuring), a run's processes,
the workflows' trust checks and job summaries, the per-session summaries, and ``gpu_gate``, the whole GPU
verdict in one command."""
