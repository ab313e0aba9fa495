"""Head boundary markers: how a graph pass finds a verify head's exact inputs and outputs.

While torch.export traces (and only then), every head passes its arguments through
one `dflash::head_boundary(..., role="inputs")` node and its results through one
`role="outputs"` node, in SPEC.md's argument order. The markers make the head's
boundary explicit in the graph: `lowering/fuse_verify.py` swaps everything between
them for the fused op; for programs that keep the plain ATen head, `strip` removes
them before lowering, so no program ever contains them. Eager code never sees them.
"""

import operator

import torch


@torch.library.custom_op("dflash::head_boundary", mutates_args=())
def head_boundary(xs: list[torch.Tensor], head: str, role: str) -> list[torch.Tensor]:
    return [x.clone() for x in xs]


@head_boundary.register_fake
def _(xs, head, role):
    return [torch.empty_like(x) for x in xs]


MARKER = torch.ops.dflash.head_boundary.default


def mark(head: str, role: str, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Identity, recorded as a boundary node when exporting."""
    if not torch.compiler.is_exporting():
        return xs
    return tuple(torch.ops.dflash.head_boundary(list(xs), head, role))


def strip(ep: torch.export.ExportedProgram) -> int:
    """Remove every boundary marker (its results become its inputs); returns how many."""
    graph = ep.graph_module.graph
    markers = [n for n in graph.nodes if n.op == "call_function" and n.target is MARKER]
    for marker in markers:
        values = marker.args[0]
        for user in list(marker.users):
            if user.op != "call_function" or user.target is not operator.getitem:
                raise RuntimeError(f"boundary marker {marker.name} is used by {user.name} directly")
            user.replace_all_uses_with(values[user.args[1]])
            graph.erase_node(user)
        graph.erase_node(marker)
    if markers:
        graph.lint()
        ep.graph_module.recompile()
    return len(markers)
