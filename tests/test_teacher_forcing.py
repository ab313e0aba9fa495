"""tests/teacher_forcing.py, the bfloat16 check of the CUDA runner, on the CPU: a program agrees
with every token it generated itself, and not with a token changed behind its back."""

import pytest

import teacher_forcing
from dflash_et.export import builder, config, driver


@pytest.fixture(scope="module")
def program():
    return driver.Program.eager(builder.build(config.load("tiny-dflash-sampling")))


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_agreement_with_its_own_tokens_and_a_changed_one(program, temperature, one_thread):
    owner = driver.Owner("o", [5, 17, 99, 3, 250, 41, 7, 8, 9], 40, temperature=temperature, top_k=50,
                         top_p=0.9, seed=11)
    tokens = driver.generate(program, [owner], mode="target_only").tokens["o"]
    assert teacher_forcing.agreement(program, owner, tokens) == [True] * len(tokens)
    changed = list(tokens)
    changed[6] = (changed[6] + 1) % program.constants["vocab_size"]
    same = teacher_forcing.agreement(program, owner, changed)
    assert len(same) == len(tokens) and same[:6] == [True] * 6 and not same[6]
