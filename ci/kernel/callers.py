"""How a vLLM release's own code calls the Marlin MoE entry points, read from the release (not assumed).

The CPU tier holds the non-EP promise on every ``global_num_experts`` a caller can hand ``fused_marlin_moe``
without expert parallelism. Which those are is the release's to say: its call sites (``ast``, every Python
file of the tree), what each passes as ``global_num_experts`` and ``expert_map``, and whether the modular
kernel (``modular_kernel.py``) turns ``-1`` into the local expert count before the experts run (vLLM 0.25.1,
line 1416: a server without EP then calls ``fused_marlin_moe`` with ``global_num_experts == E``).

A call site whose ``global_num_experts`` is none of the forms known here is reported as such: the CPU tier's
test of the callers fails naming it, so a new way to reach the kernel is seen the day a release brings it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ENTRY_POINTS = ("fused_marlin_moe", "batched_fused_marlin_moe")
G_PARAMETER = "global_num_experts"
G_POSITION = {"fused_marlin_moe": 11}  # its index in fused_marlin_moe's signature (0.25.1 to 0.33.0)
# the non-EP forms of global_num_experts: the default (-1), and the local expert count (E)
MINUS_ONE, LOCAL, PASSED_THROUGH, UNKNOWN = "-1", "E", "passed through", "unknown"
LOCAL_NAMES = {"E", "local_num_experts", "num_local_experts", "local_experts"}


@dataclass(frozen=True)
class CallSite:
    path: str  # relative to the tree
    line: int
    callee: str
    g_expression: str  # as written ("(default)" when not passed)
    g_form: str  # MINUS_ONE, LOCAL, PASSED_THROUGH or UNKNOWN
    expert_map: str  # as written ("(default)": None)

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.callee}(global_num_experts={self.g_expression})"


def _form(node: ast.expr | None, params: set[str]) -> str:
    if node is None:
        return MINUS_ONE
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return MINUS_ONE if node.operand.value == 1 else UNKNOWN
    if isinstance(node, ast.Name):
        if node.id in LOCAL_NAMES:
            return LOCAL
        return PASSED_THROUGH if node.id in params else UNKNOWN
    if ast.unparse(node).endswith((".size(0)", ".shape[0]")):  # w1.size(0): the local expert count
        return LOCAL
    return UNKNOWN


def _calls(parsed: ast.Module):
    """(call, the parameters of the function it is in) for every call in ``parsed``."""
    stack: list[tuple[ast.AST, set[str]]] = [(parsed, set())]
    while stack:
        node, params = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            params = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
        if isinstance(node, ast.Call):
            yield node, params
        stack.extend((child, params) for child in ast.iter_child_nodes(node))


def _callee(call: ast.Call) -> str | None:
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    return name if name in ENTRY_POINTS else None


def call_sites(tree: Path) -> list[CallSite]:
    """Every call of the Marlin MoE entry points in the Python files of ``tree`` (its ``vllm/`` package)."""
    found = []
    for path in sorted((tree / "vllm").rglob("*.py")):
        text = path.read_bytes()
        if not any(name.encode() in text for name in ENTRY_POINTS):  # no call can be in it
            continue
        try:
            parsed = ast.parse(text)  # a file that does not parse is skipped: its name is in no message
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue
        for call, params in _calls(parsed):
            callee = _callee(call)
            if callee is None:
                continue
            keywords = {k.arg: k.value for k in call.keywords if k.arg}
            g = keywords.get(G_PARAMETER)
            position = G_POSITION.get(callee)
            if g is None and position is not None and len(call.args) > position:
                g = call.args[position]
            emap = keywords.get("expert_map")
            found.append(
                CallSite(
                    path=path.relative_to(tree).as_posix(),
                    line=call.lineno,
                    callee=callee,
                    g_expression="(default)" if g is None else ast.unparse(g),
                    g_form=_form(g, params),
                    expert_map="(default)" if emap is None else ast.unparse(emap),
                )
            )
    return found


def modular_kernel_makes_g_local(tree: Path) -> bool:
    """Whether the release's modular kernel sets ``global_num_experts`` to the local expert count when it is
    -1 (``if global_num_experts == -1: global_num_experts = <local>``) before calling the experts."""
    path = tree / "vllm" / "model_executor" / "layers" / "fused_moe" / "modular_kernel.py"
    try:
        parsed = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    for node in ast.walk(parsed):
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)):
            continue
        test = ast.unparse(node.test).replace(" ", "")
        if test != f"{G_PARAMETER}==-1":
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == G_PARAMETER for t in stmt.targets
            ):
                return True
    return False


def non_ep_forms(tree: Path) -> dict[str, list[str]]:
    """The non-EP ``global_num_experts`` values the release's callers can hand ``fused_marlin_moe``, each with
    the call sites (or the modular kernel) that make it: ``-1`` and/or ``E``; a site of unknown form under
    ``unknown``."""
    forms: dict[str, list[str]] = {}
    modular = modular_kernel_makes_g_local(tree)
    for site in call_sites(tree):
        if site.callee != "fused_marlin_moe":
            continue
        if site.g_form == PASSED_THROUGH:
            forms.setdefault(MINUS_ONE, []).append(str(site))
            if modular:
                forms.setdefault(LOCAL, []).append(f"{site} from the modular kernel, which turns -1 into E")
        else:
            forms.setdefault(site.g_form, []).append(str(site))
    return forms
