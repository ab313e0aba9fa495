"""lowering/shared_state.py: within `tensors_shared_on_deepcopy`, a deep copy of an
ExportedProgram shares its weights, buffers and constants and copies the rest; outside it,
a deep copy copies everything again. (The CUDA lowering gives the same bytes either way:
tests/lowering/test_parallel_compile.py; the portable one's programs are checked token by
token in tests/export.)"""

import copy

import torch

from dflash_et.lowering.shared_state import tensors_shared_on_deepcopy


class Cached(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("cache", torch.zeros(8, 4))
        self.scale = torch.tensor(2.0)  # a lifted constant

    def forward(self, x, at):
        self.cache.index_copy_(0, at, self.linear(x))
        return self.cache.sum(0) * self.scale


def _program():
    return torch.export.export(Cached(), (torch.randn(2, 4), torch.tensor([1, 5])), strict=False)


def _tensors(ep):
    return {**ep.state_dict, **ep.constants}


def test_a_copy_within_shares_the_tensors_and_copies_the_graph():
    ep = _program()
    assert set(_tensors(ep)) == {"linear.weight", "linear.bias", "cache", "scale"}
    with tensors_shared_on_deepcopy():
        twin = copy.deepcopy(ep)
    for name, t in _tensors(ep).items():
        assert _tensors(twin)[name] is t, name
    assert twin.graph_module is not ep.graph_module and twin.state_dict is not ep.state_dict
    assert twin.graph is not ep.graph and len(list(twin.graph.nodes)) == len(list(ep.graph.nodes))
    twin.state_dict.pop("cache")  # a pass that drops an entry from the copy's dict
    assert "cache" in ep.state_dict


def test_outside_a_copy_copies_the_tensors_again():
    ep = _program()
    with tensors_shared_on_deepcopy():
        pass
    assert "__deepcopy__" not in vars(type(ep))
    twin = copy.deepcopy(ep)
    for name, t in _tensors(ep).items():
        assert _tensors(twin)[name] is not t and torch.equal(_tensors(twin)[name], t), name
