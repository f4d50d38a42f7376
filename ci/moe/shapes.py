"""The MoE shapes of real models, in one place (standard library only): the kernel bench times them at
full size, the GPU suite scales some of them down (``scaled``), and the TPOT stage's shipped configs
(``ci/serving/models/``) must agree with them (a unit test checks it).

A shape is what ``fused_marlin_moe`` sees per layer: hidden size K, the expert intermediate size N
(before the gate/up split), the global expert count G and top-k.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int  # K
    intermediate: int  # N (per expert, before the gate/up split)
    experts: int  # G, global
    topk: int
    note: str = ""


MODELS = {
    s.name: s
    for s in (
        Shape("deepseek-v3", 7168, 2048, 256, 8),
        Shape("qwen3-30b-a3b", 2048, 768, 128, 8),
        Shape("mixtral-8x7b", 4096, 14336, 8, 2),
        Shape("gpt-oss-120b", 2944, 2944, 128, 4, "2880 padded to 2944 (Marlin: multiples of 128)"),
    )
}


def scaled(model: str, name: str, *, experts: int | None = None, intermediate: int | None = None) -> Shape:
    """``model``'s shape with fewer experts or a smaller intermediate size (GPU-suite sizes), noted."""
    full = MODELS[model]
    notes = [full.note] if full.note else []
    if experts is not None and experts != full.experts:
        notes.append(f"experts scaled {full.experts} -> {experts}")
    if intermediate is not None and intermediate != full.intermediate:
        notes.append(f"intermediate scaled {full.intermediate} -> {intermediate}")
    return replace(
        full,
        name=name,
        experts=experts or full.experts,
        intermediate=intermediate or full.intermediate,
        note="; ".join(notes),
    )
