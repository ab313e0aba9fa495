"""Export-and-run check: load an artifact in `executorch.runtime`, run every method,
compare with the eager reference.

Head methods run on seeded random cases (`cases.py`); their token ids must equal
the eager reference's, except where SPEC.md allows a difference (`legal.py`),
which is counted and reported separately. Constant methods must return what
the config says. DFlash programs also run the reference driver's speculative
loop (`driver.py`) against target-only decoding.
"""

import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import artifact, builder, cases, heads, legal, methods, rng, runtime_log
from .driver import Program, compare, compare_drafts, generate, scenario
from .config import ExportConfig


@dataclass
class MethodResult:
    name: str
    runs: int = 0
    exact: int = 0
    legal: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def load_program(directory: Path):
    """The artifact's program, loaded in `executorch.runtime` (every method loadable)."""
    from executorch.runtime import Runtime

    pte = directory / artifact.PTE
    if not pte.exists():
        raise artifact.ArtifactError(f"{pte} does not exist; run `dflash-et export` first")
    return Runtime.get().load_program(pte)


def _run(program, name: str, inputs: dict, spec: methods.MethodSpec) -> list[torch.Tensor]:
    method = program.load_method(name)
    return list(runtime_log.first_call(lambda: method.execute([inputs[t.name] for t in spec.inputs])))


def _check_head(program, spec: methods.MethodSpec, cfg_limits, vocab, dtype, runs, g) -> MethodResult:
    result = MethodResult(spec.name)
    reference = heads.HEADS[spec.head].module()  # unrolled searches: the plain reference
    for case_no in range(runs):
        if spec.head == "sample_rows":
            inputs = cases.sample_case(g, vocab, cfg_limits.max_rows, dtype)
        else:
            inputs = cases.verify_case(
                g, vocab, cfg_limits.max_rows, cfg_limits.max_owners, dtype,
                greedy_only=spec.head == "dflash_verify_argmax",
            )
        args = [inputs[t.name] for t in spec.inputs]
        got = _run(program, spec.name, inputs, spec)
        want = reference(*args)
        want = list(want) if isinstance(want, tuple) else [want]
        result.runs += 1
        if all(torch.equal(a, b) for a, b in zip(got, want)):
            result.exact += 1
            continue
        if spec.head == "sample_rows":
            u = rng.uniform(inputs["seed"], inputs["position"], rng.SAMPLE)
            close = legal.close_rows(inputs["logits"], inputs["temperature"], inputs["top_k"], inputs["top_p"], u)
            differ = got[0] != want[0]
        else:
            if spec.head == "dflash_verify_argmax":
                close = torch.zeros(inputs["offsets"].shape[0] - 1, dtype=torch.bool)
            else:
                close = legal.close_owners(*[inputs[t.name] for t in spec.inputs])
            differ = (got[0] != want[0]) | (got[1] != want[1])
        if bool((differ & ~close).any()):
            bad = int(torch.nonzero(differ & ~close)[0])
            result.problems.append(
                f"case {case_no}: index {bad} differs: program {[t[bad].item() for t in got]}, "
                f"reference {[t[bad].item() for t in want]}"
            )
        else:
            result.legal += 1
    return result


def check_artifact(
    cfg: ExportConfig, directory: str | Path, runs: int = 20, seed: int = 0, stream=None
) -> bool:
    """Run the check and print a report; True when everything matches."""
    stream = stream or sys.stdout
    directory = Path(directory)
    artifact.open_checked(directory, cfg.digest())
    spec = builder.build(cfg)
    program = load_program(directory)
    g = torch.Generator().manual_seed(seed)
    results = []

    exported = set(program.method_names)
    constants = methods.constant_names(spec)
    expected = {m.name for m in spec.methods} | set(constants)
    if exported != expected:
        r = MethodResult("(method list)")
        r.problems.append(f"program has {sorted(exported)}, config expects {sorted(expected)}")
        results.append(r)

    for name, value in constants.items():
        r = MethodResult(name, runs=1)
        got = program.load_method(name).execute([])[0]
        got = got.tolist() if isinstance(got, torch.Tensor) else got  # list constants: int64 tensors
        if got == value:
            r.exact = 1
        else:
            r.problems.append(f"returns {got!r}, config says {value!r}")
        results.append(r)

    for m in spec.methods:
        if m.head is not None:
            vocab = m.inputs[0].shape[1]
            results.append(_check_head(program, m, cfg.limits, vocab, m.inputs[0].dtype, runs, g))
    if cfg.program == "dflash":
        results.extend(_check_loop(directory, spec, seed))

    width = max(len(r.name) for r in results)
    print(f"check of {directory} ({cfg.program}, {cfg.variant}, {cfg.backend})", file=stream)
    for r in results:
        status = "ok" if r.ok else "MISMATCH"
        extra = f", {r.legal} with legal differences only" if r.legal else ""
        print(f"  {r.name:<{width}}  {status:<8}  {r.exact}/{r.runs} exact{extra}", file=stream)
        for p in r.problems[:5]:
            print(f"      {p}", file=stream)
    ok = all(r.ok for r in results)
    print("check passed" if ok else "check FAILED", file=stream)
    return ok


def _check_loop(directory, spec: methods.ProgramSpec, seed: int) -> list[MethodResult]:
    """A DFlash program's loop (driver.py): speculative == target-only, known-right drafts all
    accepted, the eager modules commit the program's tokens and drafts."""
    program = Program.load(spec, Path(directory))
    owners = scenario(program, seed)
    reference = generate(program, [o.fresh(join=0, leave=None) for o in owners], mode="target_only")
    speculative = generate(program, owners)
    oracle = generate(program, owners, oracle=reference.tokens)
    eager = generate(Program.eager(spec), owners)

    def result(name, pairs, extra=None):
        r = MethodResult(name, runs=len(pairs), exact=sum(ok for _, ok, _ in pairs))
        r.problems += [f"{who}: {why}" for who, ok, why in pairs if not ok]
        if extra:
            r.problems.append(extra)
        return r

    verifies = sum(len(s.rows) for s in oracle.steps)
    missed = sum(a != n for s in oracle.steps for a, n in zip(s.acceptance, s.rows))
    drafted = sum(n - 1 for s in oracle.steps for n in s.rows)
    return [
        result("loop: speculative == target-only", compare(speculative, reference)),
        result("loop: known-right drafts all accepted", compare(oracle, reference),
               f"{missed} of {verifies} verify calls rejected a right draft" if missed else
               None if drafted else "the run verified no drafts"),
        result("loop: eager == program", compare(eager, speculative), compare_drafts(eager, speculative)),
    ]
