"""A drafter distilled on its target's greedy text (export/models/distill.py): its drafts of
that text are accepted, so the loop commits several rows per step, and the committed tokens
stay those of target-only decoding; bad recipes and prompts are refused by name."""

import pytest

from dflash_et.export import config, distilling, driver
from dflash_et.export.config import ConfigError
from dflash_et.export.models import distill

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def _program(name: str = "tiny-dflash-greedy"):
    return distilling.eager_program(config.load(name))


def test_distilled_drafts_of_the_greedy_text_are_accepted_and_change_no_token():
    program, target, drafter = _program()
    owners = driver.scenario(program, seed=0, owners=program.constants["max_owners"])
    random_run = driver.generate(program, [o.fresh() for o in owners])
    drafter.load_state_dict(distill.distill(target, drafter, [o.prompt for o in owners]))
    run = driver.generate(program, [o.fresh() for o in owners])
    block = program.constants["block_size"]
    assert random_run.acceptance_length() < 1.2  # a random drafter is almost never right
    assert run.acceptance_length() > 0.75 * block, (run.acceptance_length(), block)  # measured: 3.88 of 4
    assert sum(a == block for s in run.steps for a in s.acceptance) > len(run.steps)  # whole blocks committed
    # Lossless: the tokens of target-only decoding (owners that leave commit a prefix of them).
    reference = driver.generate(program, [o.fresh(join=0, leave=None) for o in owners], mode="target_only")
    assert all(same for _, same, _ in driver.compare(run, reference, partial=True))
    assert all(same for _, same, _ in driver.compare(random_run, reference, partial=True))


@pytest.mark.parametrize("recipe, prompts, error", [
    (dict(steps=0), [[1, 2]], "steps must be at least 1, not 0"),
    (dict(lr=0.0), [[1, 2]], "lr must be positive"),
    (dict(new_tokens=3), [[1, 2]], r"new_tokens \(3\) must be at least block_size \(4\)"),
    ({}, [[1, 256]], r"prompt tokens \[256\] are outside the target's vocab \[0, 256\)"),
    ({}, [[1, 2], []], "each of at least one token"),
    ({}, [], "at least one prompt"),
])
def test_bad_recipes_and_prompts_are_refused(recipe, prompts, error):
    with pytest.raises(ConfigError, match=error):
        _, target, drafter = _program()
        distill.distill(target, drafter, prompts, distill.Recipe(**recipe))
