"""The Triton fused-MoE path of vLLM as a subject of the gate (begun: the spec of its config choice)."""
