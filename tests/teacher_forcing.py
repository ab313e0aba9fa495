"""Teacher-forced agreement: how many of a token sequence a program decides itself when
every earlier token is forced to the sequence's.

Comparing two free-running loops stops meaning anything after their first difference
(each continues from another prefix). Here the program (e.g. the eager bfloat16 modules)
is fed the other side's tokens (e.g. the C++ runner's commits) as drafts: target_verify
decides every position on exactly that side's prefix, with the owner's sampling rule and
its random numbers at those positions, and the sequence's tokens, not the program's own,
are committed after each call. Every token gets one decision.
"""

import torch

from dflash_et.export import driver


def agreement(program: driver.Program, owner: driver.Owner, tokens: list[int]) -> list[bool]:
    """Per token of `tokens` (what followed `owner.prompt`): does `program` decide it on the
    forced prefix? The owner takes slot 0; the program's caches are overwritten."""
    o = owner.fresh(slot=0)
    driver.prefill(program, [o], speculative=False)
    same = [o.generated[0] == tokens[0]]
    o.generated = tokens[:1]  # forced
    block = program.constants["block_size"] if "target_verify" in program.methods else 1
    while len(o.generated) < len(tokens):
        done = len(o.generated)
        rows = [tokens[done - 1]] + tokens[done:done + block - 1]
        out = program("target_verify", tokens=torch.tensor(rows), offsets=torch.tensor([0, len(rows)]),
                      start_position=torch.tensor([o.position]), slots=torch.tensor([0]),
                      **driver._sampling_inputs(program, [o]))
        accepted, nxt = int(out["accepted"][0]), int(out["next_token"][0])
        same += [True] * accepted  # the drafts it accepted are its own decisions
        if done + accepted < len(tokens):
            same.append(nxt == tokens[done + accepted])
        o.generated = tokens[:done + accepted + 1]
        o.position += accepted + 1
    return same[:len(tokens)]
