"""The Triton fused-MoE path of vLLM as a subject of the gate: the spec of its config choice, the bench of one
EP rank's ``fused_experts_impl`` with its regret table, and the subject's registration with the core."""
