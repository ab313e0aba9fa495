"""lowering/et_compat.py: a delegate's KV-cache writes come before its user outputs.

The GPU machine's ExecuTorch 1.2.0 + torch 2.11 cut a partition out in the order of a
first-in-first-out topological sort and do not reorder the delegate's outputs; a
method returning a shallow value (the DFlash target's hidden taps) next to a deep
buffer write then fails the verifier. Here that behaviour is reproduced on the CI's
ExecuTorch 1.5 (its stable sort and its own reordering switched off) on a small
module of that shape: without the fix the delegate cannot be built, with it the
delegate's outputs are ordered and the partitioned graph computes what it did.
"""

import collections
import copy
import operator

import pytest
import torch
from torch import nn

pytest.importorskip("executorch")
from executorch.exir import EdgeCompileConfig, to_edge  # noqa: E402
from executorch.exir import lowered_backend_module as lbm  # noqa: E402
from torch.export.graph_signature import OutputKind  # noqa: E402

from dflash_et.lowering.et_compat import delegate_outputs_in_order  # noqa: E402

pytestmark = pytest.mark.quick  # scripts/test.sh --quick


class Taps(nn.Module):
    """Two cache writes, one shallow and one deep, and a shallow 'tap' output."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache0", torch.zeros(4, 8))
        self.register_buffer("cache1", torch.zeros(4, 8))

    def forward(self, x):
        h0 = torch.sin(x)
        self.cache0.add_(h0)  # reads and writes the buffer, like a KV-cache update
        h1 = torch.cos(torch.exp(torch.tanh(h0 * 0.5)))
        self.cache1.add_(h1)
        return h1 + 1.0, torch.cat([h0, h0 * 2.0], dim=1)


def _fifo_topo_sort(nodes):  # torch 2.11's fuser_utils.topo_sort
    indegree = dict.fromkeys(nodes, 0)
    queue = collections.deque()
    for n in nodes:
        indegree[n] = sum(1 for x in n.all_input_nodes if x in indegree)
        if indegree[n] == 0:
            queue.append(n)
    out = []
    while queue:
        n = queue.popleft()
        out.append(n)
        for u in n.users:
            if u in indegree:
                indegree[u] -= 1
                if indegree[u] == 0:
                    queue.append(u)
    return out


def _edge_program():
    ep = torch.export.export(Taps(), (torch.randn(4, 8),), strict=False)
    return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()


def _run(program, x):
    """The program's graph module on `x`, its buffers and constants passed as they are stored."""
    sig = program.graph_signature
    targets = {**sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    values = {**program.state_dict, **program.constants}
    args = [x if n.name in sig.user_inputs else values[targets[n.name]].clone()
            for n in program.graph.nodes if n.op == "placeholder"]
    return program.graph_module(*args)


def _delegate_everything(program):
    """What to_backend does for one partition that takes every node (as CudaPartitioner does)."""
    tag = "whole"
    for node in program.graph.nodes:
        if node.op in ("call_function", "placeholder") and not (
            node.op == "placeholder" and node.name in program.graph_signature.user_inputs
        ):
            node.meta["delegation_tag"] = tag
    nodes = [n for n in program.graph.nodes if n.op == "call_function"]
    with program.graph_module._set_replace_hook(program.graph_signature.get_replace_hook()):
        submodule, call = lbm.create_submodule_from_nodes(program.graph_module, nodes, tag)
    sub_program, _, _ = lbm.create_exported_program_from_submodule(submodule, program, tag, call, False)
    return sub_program


@pytest.fixture
def older_executorch(monkeypatch):
    monkeypatch.setattr(lbm, "topo_sort", _fifo_topo_sort)
    monkeypatch.setattr(lbm, "arrange_graph_outputs", lambda gm, specs, node: gm, raising=False)


def test_without_the_fix_the_delegate_fails_the_verifier(older_executorch):
    with pytest.raises(Exception, match="neither a buffer nor a user input"):
        _delegate_everything(_edge_program())


def test_with_the_fix_cache_writes_come_first_and_results_are_unchanged(older_executorch):
    program = _edge_program()
    x = torch.randn(4, 8)
    want = _run(copy.deepcopy(program), x)  # cache0, cache1 after the writes, then the two outputs
    with delegate_outputs_in_order(force=True):
        sub = _delegate_everything(program)
    kinds = [s.kind for s in sub.graph_signature.output_specs]
    assert kinds == [OutputKind.BUFFER_MUTATION] * 2 + [OutputKind.USER_OUTPUT] * 2
    got = _run(sub, x)  # the delegate's outputs, in its (reordered) output order
    for a, b in zip(got[:2], want[:2]):  # the cache writes first, in the program's order
        torch.testing.assert_close(a, b)
    parent_outputs = program.graph.output_node().args[0]
    assert len(parent_outputs) == len(want) == 4
    for i, node in enumerate(parent_outputs):  # the parent's getitems pick the right outputs
        assert node.target is operator.getitem
        torch.testing.assert_close(got[node.args[1]], want[i])


def test_the_fix_is_off_where_executorch_reorders_itself():
    if not hasattr(lbm, "arrange_graph_outputs"):
        pytest.skip("this ExecuTorch has no arrange_graph_outputs")
    original = lbm._get_new_signature
    with delegate_outputs_in_order():
        assert lbm._get_new_signature is original
    with delegate_outputs_in_order(force=True):
        assert lbm._get_new_signature is not original
    assert lbm._get_new_signature is original
