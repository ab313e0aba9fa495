"""Rewritten methods as one runnable program, in Python.

After the fusion pass, each method is an ExportedProgram whose `module()` runs in
PyTorch (before AOTInductor): on a GPU, or on the CPU with TRITON_INTERPRET=1.
The methods of a DFlash program share their KV / context caches by name in the
`.pte`; here the methods' graph modules are made to hold the very same buffer
tensors, so one method's cache writes are the next method's reads, as in the
program. The reference driver (`export/driver.py`) then runs its full
speculative loop on them.

torch.export leaves size checks in the graphs and on their inputs, some of them
artefacts of tracing with two owners (a contiguity check on `offsets[:-1]` becomes
O >= 2). The `.pte` does not run them (a single owner works there); here they are
dropped too, so the graphs run the same calls the program runs.
"""

import torch

from dflash_et.export import driver


def _set_buffer(module: torch.nn.Module, fqn: str, tensor: torch.Tensor) -> None:
    owner_path, _, name = fqn.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    owner.register_buffer(name, tensor, persistent=name in owner._buffers and name not in
                          owner._non_persistent_buffers_set)


_ASSERTS = ("aten._assert_scalar", "aten.sym_constrain_range_for_size", "aten._assert_tensor_metadata")


def runnable_module(program: torch.export.ExportedProgram) -> torch.fx.GraphModule:
    """`program.module()` without torch.export's size checks (the calls the `.pte` runs)."""
    module = program.module()
    module._forward_pre_hooks.clear()  # torch.export's input-constraint check
    for node in list(module.graph.nodes):
        guards = node.op == "call_module" and node.target == "_guards_fn"  # newer torch: guards as code
        if (guards or node.op == "call_function" and str(node.target).startswith(_ASSERTS)) and not node.users:
            module.graph.erase_node(node)
    module.graph.eliminate_dead_code()
    module.recompile()
    return module


def graph_program(spec, programs: dict, device: str = "cpu") -> driver.Program:
    """A driver Program over the graph modules of `programs` (method name -> ExportedProgram)."""
    modules = {name: runnable_module(ep).to(device) for name, ep in programs.items()}
    shared: dict[str, torch.Tensor] = {}
    for module in modules.values():
        for fqn, buf in list(module.named_buffers()):
            if fqn in shared:
                if shared[fqn].shape != buf.shape or shared[fqn].dtype != buf.dtype:
                    raise RuntimeError(f"buffer {fqn} differs between methods: {tuple(buf.shape)} {buf.dtype}")
                _set_buffer(module, fqn, shared[fqn])
            else:
                shared[fqn] = buf

    def call(name, args):
        with torch.no_grad():
            out = modules[name](*[a.to(device) for a in args])
        return [o.cpu() for o in (out if isinstance(out, (tuple, list)) else [out])]

    return driver.Program(spec, call)
