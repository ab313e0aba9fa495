"""Swap each verify head's ATen subgraph for one call to its fused `dflash::` op (and, asked
for by name, each `layers.CachedAttention` for `dflash::cached_attention`, each
`layers.GreedyRows` for `dflash::greedy_rows`, each `qwen3_5.DeltaRows` for
`dflash::delta_rows`).

A head is found by its module, never by op patterns: every node traced inside a
head module carries that module (path and class) in `nn_module_stack`, and while
exporting each head marks its exact arguments and results with a
`dflash::head_boundary` node (`export/boundary.py`), in SPEC.md's order. The region
of a head is every node traced inside its module, markers included.

For each region the pass checks the boundary against the head's signature
(SPEC.md: argument count, dtypes, ranks; the kernel's `supports`) and that nothing
outside reads the region's insides or the region reads anything but its inputs,
then inserts the op, rewires every use of the results (keeping their
`meta["val"]`), erases the region, and renames a method output in the graph signature
where the head's result was one (kinds and order stay). All
regions are checked before any is rewritten: a mismatch raises `FuseError` naming
the node, and the graph is never left half-rewritten.

`fused_at_trace` makes tracing cheap for a program whose regions are all fused: while it
is on, each region module runs its fused op between its markers instead of its ATen
body (the sampling reference's cut searches were most of a CUDA method's trace time), and
the pass then swaps that one-op region for the same call the full region would give.
"""

import contextlib
import inspect
import operator
from dataclasses import dataclass, field

import torch
from torch import fx

from ..export.boundary import MARKER, mark
from ..export.heads import HEADS
from ..export.models import layers, qwen3_5
from .errors import LoweringError

@dataclass(frozen=True)
class Region:
    """A kind of region the pass swaps for one fused op (`kernels.OPS[name]`): its module, its
    boundary (inputs as (dtype, or None for a float, rank); output count) and the setting that
    keeps it plain ATen."""

    module: type
    inputs: tuple[tuple[torch.dtype | None, int], ...]
    outputs: int
    off: str


# Region name -> Region: the verify heads (export/heads.py: HEADS) and the attention over a KV
# cache (the target's and the drafter's, layers.CachedAttention: q, k_cache, v_cache of one
# float dtype; slot, lo, hi).
REGIONS = {
    **{name: Region(h.module, tuple((a.dtype, a.rank) for a in h.inputs), len(h.outputs),
                    "lowering.fused_verify: false") for name, h in HEADS.items()},
    "cached_attention": Region(layers.CachedAttention, ((None, 3), (None, 4), (None, 4), (torch.int64, 1),
                                                        (torch.int64, 1), (torch.int64, 1)), 1,
                               "lowering.fused_attention: false"),
    "greedy_rows": Region(layers.GreedyRows, ((None, 2),), 1, "lowering.fused_verify: false"),  # the drafts' argmax
    # A hybrid target's recurrence (slot, conv input, a, b, conv weight, A_log, dt_bias, windows, states): always
    # fused in a CUDA export, whose partitioner cannot take its scan.
    "delta_rows": Region(qwen3_5.DeltaRows, ((torch.int64, 1), (None, 2), (None, 2), (None, 2), (None, 2), (None, 1),
                                             (None, 1), (None, 3), (None, 4)), 3,
                         "backend: portable (a CUDA export of a hybrid target always fuses its recurrence)"),
}


def _fused_op(name: str, inputs: list[torch.Tensor]) -> tuple:
    """(the fused op, None or why its kernel does not take these inputs)."""
    from ..kernels import OPS  # registers torch.ops.dflash (needs triton): only when fusing

    op, unsupported = OPS[name]
    return op, unsupported(inputs)


class FuseError(LoweringError):
    """A head region the pass refuses to rewrite (the message names the node)."""


@dataclass
class Match:
    head: str  # SPEC.md head name
    fqn: str  # module path of the head ("" for the exported root)
    nodes: list[fx.Node]  # the region, in graph order
    inputs: list[fx.Node]  # head arguments, in signature order
    outputs: list[fx.Node | None]  # head results, in signature order (None: a result nothing reads)
    values: list  # the results' meta["val"]


@dataclass
class FuseResult:
    modified: bool
    count: int
    heads: list[str] = field(default_factory=list)  # "head@fqn" rewritten


def _head_of(node: fx.Node, by_class: dict[str, str]) -> tuple[str, str] | None:
    """(region name, module path) of the innermost region module a node was traced in."""
    found = None
    for path, cls in (node.meta.get("nn_module_stack") or {}).values():
        cls_name = cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"
        if cls_name in by_class:
            found = (by_class[cls_name], path)
    return found


def _markers(nodes: list[fx.Node], head: str, fqn: str) -> tuple[list[fx.Node], list[fx.Node | None], list]:
    """(arguments, results, the results' values) of one head call, from its boundary markers (a
    result nothing reads, e.g. the outputs of a hybrid target's commit, is None)."""
    where = f"head {head} at {fqn or '<root>'}"
    marks = {role: [n for n in nodes if n.target is MARKER and n.args[2] == role] for role in ("inputs", "outputs")}
    if len(marks["inputs"]) != 1 or len(marks["outputs"]) != 1:
        raise FuseError(f"{where}: expected one inputs and one outputs boundary marker, found "
                        f"{len(marks['inputs'])} and {len(marks['outputs'])} (called more than once, or "
                        "traced without torch.export?)")
    enter, leave = marks["inputs"][0], marks["outputs"][0]
    for marker in (enter, leave):
        if marker.args[1] != head:
            raise FuseError(f"{where}: marker {marker.name} belongs to head {marker.args[1]}")
    read = {u.args[1]: u for u in leave.users if u.target is operator.getitem}
    if len(read) != len(leave.users) or not read:
        raise FuseError(f"{where}: results of marker {leave.name} are not all read by position")
    return list(enter.args[0]), [read.get(i) for i in range(len(leave.args[0]))], list(leave.meta["val"])


def match(ep: torch.export.ExportedProgram, kinds: tuple[str, ...] = tuple(HEADS)) -> list[Match]:
    """Every region of the program of the `kinds` (names of REGIONS; default: the verify
    heads), checked; raises FuseError on a bad boundary."""
    by_class = {f"{REGIONS[k].module.__module__}.{REGIONS[k].module.__qualname__}": k for k in kinds}
    graph = ep.graph_module.graph
    regions: dict[tuple[str, str], list[fx.Node]] = {}
    for node in graph.nodes:
        if node.op == "call_function":
            head = _head_of(node, by_class)
            if head is not None:
                regions.setdefault(head, []).append(node)
    matches = []
    for (head, fqn), nodes in regions.items():
        inputs, outputs, values = _markers(nodes, head, fqn)
        _check(head, fqn, nodes, inputs, outputs)
        matches.append(Match(head, fqn, nodes, inputs, outputs, values))
    return matches


def _check(head, fqn, nodes, inputs, outputs) -> None:
    where = f"head {head} at {fqn or '<root>'}"
    region_kind = REGIONS[head]
    want, results, off = region_kind.inputs, region_kind.outputs, region_kind.off  # None dtype: a float
    if len(inputs) != len(want):
        raise FuseError(f"{where}: {len(inputs)} inputs, the signature has {len(want)}")
    if len(outputs) != results:
        raise FuseError(f"{where}: {len(outputs)} outputs, the signature has {results}")
    for node, (dtype, rank) in zip(inputs, want):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dim() != rank or (dtype is not None and val.dtype != dtype):
            got = f"{val.dtype} rank {val.dim()}" if isinstance(val, torch.Tensor) else type(val).__name__
            raise FuseError(f"{where}: input {node.name} is {got}, expected {dtype or 'a float tensor'} rank {rank}")
    _, unsupported = _fused_op(head, [n.meta["val"] for n in inputs])
    if unsupported:
        raise FuseError(f"{where}: the fused kernel does not support {unsupported}; set {off}")
    region = set(nodes)
    allowed_inputs = set(inputs)
    for node in nodes:
        for arg in node.all_input_nodes:
            if arg in region or arg in allowed_inputs or arg.op == "get_attr" or _is_constant(arg) or _is_shape(arg):
                continue
            raise FuseError(f"{where}: node {node.name} reads {arg.name}, which is neither a head input "
                            "nor computed inside the head (the boundary was altered)")
    results = set(outputs)
    for node in nodes:
        if node in results:
            continue
        for user in node.users:
            if user not in region:
                raise FuseError(f"{where}: intermediate {node.name} is used outside the head by "
                                f"{user.name} (the boundary was altered)")


def _is_shape(node: fx.Node) -> bool:
    """Symbolic sizes (sym_size of an input, arithmetic on it) are not data: free to read."""
    return isinstance(node.meta.get("val"), (torch.SymInt, int)) and not isinstance(node.meta.get("val"), bool)


def _is_constant(node: fx.Node) -> bool:
    """Lifted tensor constants are placeholders the head may read (e.g. tables)."""
    return node.op == "placeholder" and node.name.startswith(("c_", "_lifted_tensor_constant", "lifted_tensor"))


def rewrite(graph: fx.Graph, m: Match) -> dict[str, str]:
    """One op call after the region's last node; outside uses move to it; the region goes.
    Returns {old name: new name} of the results that moved."""
    op, _ = _fused_op(m.head, [n.meta["val"] for n in m.inputs])
    with graph.inserting_after(m.nodes[-1]):
        call = graph.call_function(op, tuple(m.inputs))
    vals = m.values
    call.meta["val"] = tuple(vals) if len(vals) > 1 else vals[0]
    read = [o for o in m.outputs if o is not None]
    call.meta["nn_module_stack"] = dict(read[0].meta.get("nn_module_stack") or {})
    replacements = [call]
    if len(m.outputs) > 1:
        replacements, prev = [], call
        for i, val in enumerate(vals):
            with graph.inserting_after(prev):
                prev = graph.call_function(operator.getitem, (call, i))
            prev.meta["val"] = val
            replacements.append(prev)
    region = set(m.nodes)
    for out, new in zip(m.outputs, replacements):
        if out is not None:
            out.replace_all_uses_with(new, delete_user_cb=lambda user: user not in region)
    for node in reversed(m.nodes):
        graph.erase_node(node)
    return {out.name: new.name for out, new in zip(m.outputs, replacements) if out is not None}


def _rename_outputs(signature, renamed: dict[str, str]) -> None:
    """A method output that was a head's result is now the op's: its spec names the new node
    (the program otherwise fails ExportedProgram's validation, e.g. in torch.export.save)."""
    from torch.export.graph_signature import TensorArgument

    for spec in signature.output_specs:
        name = getattr(spec.arg, "name", None)
        if name in renamed:
            spec.arg = TensorArgument(name=renamed[name])


def head_paths(module: torch.nn.Module, kinds: tuple[str, ...] = tuple(HEADS)) -> list[tuple[str, str]]:
    """(module path, region name) of every module of the `kinds` inside `module` ("" = the
    module itself); by default the verify heads."""
    classes = {REGIONS[k].module: k for k in kinds}
    return [(path, classes[type(m)]) for path, m in module.named_modules() if type(m) in classes]


def called_regions(ep: torch.export.ExportedProgram, paths: list[str]) -> list[str]:
    """The region modules among `paths` whose parent module ran in the traced method: the
    regions it must hold. (A method may own a region module it never calls: draft_prefill
    holds the drafter's attention, which only draft_forward runs.)"""
    ran = {path for n in ep.graph.nodes for path, _ in (n.meta.get("nn_module_stack") or {}).values()}
    return [p for p in paths if "." not in p or p.rsplit(".", 1)[0] in ran]


@contextlib.contextmanager
def fused_at_trace(modules: list[torch.nn.Module], kinds: tuple[str, ...]):
    """While tracing: every region module of `kinds` inside `modules` calls its fused op on
    its marked inputs and marks the op's results, instead of running its ATen body. The
    region then holds the markers and the op, and `FuseVerifyHeads` rewrites it into the
    call it makes of any region (the op on the marked inputs), so the fused graph is the
    same, at a fraction of the trace time. A module whose inputs the kernel does not take
    keeps its body (the pass then names what is unsupported)."""
    patched = {}
    try:
        for module in modules:
            for path, kind in head_paths(module, kinds):
                region = module.get_submodule(path)
                if id(region) not in patched:  # (a module two methods share: once)
                    region.forward = _stand_in(kind, region.forward)
                    patched[id(region)] = region
        yield
    finally:
        for region in patched.values():
            del region.forward  # the class's forward again


def _stand_in(kind: str, forward):
    """`forward` of a region module of `kind`, tracing as the fused op between the markers."""
    signature = inspect.signature(forward)
    single = REGIONS[kind].outputs == 1

    def fused(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        inputs = list(bound.arguments.values())
        op, unsupported = _fused_op(kind, inputs)
        if unsupported or not torch.compiler.is_exporting():
            return forward(*args, **kwargs)
        out = op(*mark(kind, "inputs", *inputs))
        results = mark(kind, "outputs", *(out if isinstance(out, (tuple, list)) else (out,)))
        return results[0] if single else tuple(results)

    fused.__signature__ = signature  # (torch.export reads the argument names)
    return fused


class FuseVerifyHeads:
    """The pass: `FuseVerifyHeads()(ep)` rewrites every head in place; returns a FuseResult.
    With `expected` (module paths of the heads the method holds), a head that matched
    nothing raises: the export asked for fused kernels and must not ship ATen heads.
    `kinds` (names of REGIONS): the regions it rewrites (default: the verify heads;
    ("cached_attention",): the target's and the drafter's attention)."""

    def __init__(self, expected: list[str] | None = None, kinds: tuple[str, ...] = tuple(HEADS)):
        self.expected, self.kinds = expected, kinds

    def __call__(self, ep: torch.export.ExportedProgram) -> FuseResult:
        matches = match(ep, self.kinds)  # checks every region before touching any
        if self.expected is not None:
            missing = sorted(set(self.expected) - {m.fqn for m in matches})
            if missing:
                raise FuseError(f"heads at {', '.join(p or '<root>' for p in missing)} matched no region; "
                                "nothing was rewritten")
        graph = ep.graph_module.graph
        renamed = {}
        for m in matches:
            renamed.update(rewrite(graph, m))
        _rename_outputs(ep.graph_signature, renamed)
        graph.eliminate_dead_code()  # shape nodes only the head used
        _drop_dead_get_attrs(ep.graph_module)
        graph.lint()
        ep.graph_module.recompile()
        return FuseResult(modified=bool(matches), count=len(matches),
                          heads=[f"{m.head}@{m.fqn or '<root>'}" for m in matches])


def _drop_dead_get_attrs(gm: fx.GraphModule) -> None:
    """Scan bodies of erased heads (get_attr submodules) no longer have users."""
    for node in list(gm.graph.nodes):
        if node.op == "get_attr" and not node.users:
            target = node.target
            gm.graph.erase_node(node)
            if isinstance(getattr(gm, target, None), torch.nn.Module):
                delattr(gm, target)
