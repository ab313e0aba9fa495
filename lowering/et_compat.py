"""What differs between the ExecuTorch releases the CUDA lowering runs on (1.2 and 1.5).

Delegate output order. When a partition becomes a delegate, ExecuTorch cuts the
partition's nodes out in the order of a breadth-first topological sort and gives
the delegate one output per value used outside it. The exported-program verifier
then requires the KV-cache writes (buffer mutations) to come first. A DFlash target
method returns the hidden taps of layers 1 and 2, which that sort reaches before
the later layers' cache writes, so ExecuTorch 1.2.0 fails with "SpecViolationError:
Mutation node aten_cat_default_8 is neither a buffer nor a user input" (seen on the
H200). ExecuTorch 1.5 reorders the outputs itself (`arrange_graph_outputs` in
`exir/lowered_backend_module.py`); on a release without it, `delegate_outputs_in_order`
does the same reordering: mutations first, user outputs after, the parent graph's
getitem indices remapped.
"""

import contextlib
import operator

from torch.export.graph_signature import OutputKind

_MUTATIONS = (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION)


def mutations_first(gm, output_specs: list, call_module_node) -> None:
    """Reorder `gm`'s output tuple and `output_specs` (in place) so that mutations come
    first, and remap the indices of the getitem nodes that read the delegate's outputs."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    outputs = output.args[0]
    if not isinstance(outputs, (tuple, list)) or len(outputs) != len(output_specs):
        return  # a single output, or a shape this helper does not know: leave it to ExecuTorch
    order = [i for i, s in enumerate(output_specs) if s.kind in _MUTATIONS]
    order += [i for i, s in enumerate(output_specs) if s.kind not in _MUTATIONS]
    if order == list(range(len(order))):
        return
    new_index = {old: new for new, old in enumerate(order)}
    output.args = (tuple(outputs[i] for i in order),)
    output_specs[:] = [output_specs[i] for i in order]
    for user in list(call_module_node.users):
        if user.op == "call_function" and user.target is operator.getitem and user.args[1] in new_index:
            user.args = (user.args[0], new_index[user.args[1]])
    gm.graph.lint()
    gm.recompile()


@contextlib.contextmanager
def delegate_outputs_in_order(force: bool = False):
    """While lowering: put every delegate's mutation outputs first, on ExecuTorch releases
    that do not do it themselves (or always, with `force`, for tests)."""
    from executorch.exir import lowered_backend_module as lbm

    if hasattr(lbm, "arrange_graph_outputs") and not force:
        yield
        return
    original = lbm._get_new_signature

    def new_signature(original_program, gm, call_module_node, tag, is_submodule=False):
        result = original(original_program, gm, call_module_node, tag, is_submodule)
        mutations_first(gm, result[0].output_specs, call_module_node)
        return result

    lbm._get_new_signature = new_signature
    try:
        yield
    finally:
        lbm._get_new_signature = original
