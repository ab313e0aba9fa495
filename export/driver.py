"""Reference driver: the speculative loop of a DFlash program, for several owners at once.

This is the step loop of docs/CONTRACT.md in Python, over the methods of a
loaded `.pte` (executorch.runtime) or of the eager modules; a C++ runner does
the same calls. Only token ids, counts and positions are built on the host; the
`hidden` rows go from one method's output straight into the next method's input.

    join:    target_prefill (prompt chunks of <= max_rows rows) -> first token, hidden
             draft_prefill  (the same hidden, offsets, positions, slots)
    step:    draft_forward  (previous target_verify hidden, its row starts, committed
                             counts; pending tokens)          -> drafts
             target_verify  ([pending, drafts] per owner)    -> accepted, next_token, hidden
             commit drafts[:accepted] + next_token; committed = accepted + 1
    leave:   drop the owner; its slot is free for the next join

`mode="target_only"` is plain decoding with the same program: target_verify on
the pending token alone (one row per owner per step). The committed tokens of
both modes must be identical, token for token (SPEC.md), which is what
`check.py` tests, together with the eager modules giving the same tokens as the
program and a run whose drafts are known to be right (every one accepted).
"""

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import artifact, builder, methods, runtime_log
from .config import ConfigError, ExportConfig

MODES = ("speculative", "target_only")


@dataclass
class Owner:
    """One request: its prompt, budget and sampling parameters, and its state in the loop."""

    name: str
    prompt: list[int]
    max_new: int  # tokens to generate (the first token from prefill included)
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    join: int = 0  # the step at which it joins
    leave: int | None = None  # the step before which it leaves, done or not
    # loop state
    slot: int = -1
    generated: list[int] = field(default_factory=list)  # committed after the prompt; [-1] is pending
    position: int = 0  # position of the pending token
    hidden_start: int = 0  # its first row in the last target_verify's hidden
    committed: int = 0  # rows of that hidden to append to the drafter's context

    def fresh(self, **changes) -> "Owner":
        """A copy with the loop state reset (and `changes` applied)."""
        keep = {k: getattr(self, k) for k in ("name", "prompt", "max_new", "temperature", "top_k", "top_p",
                                               "seed", "join", "leave")}
        return Owner(**{**keep, **changes})

    @property
    def done(self) -> bool:
        return len(self.generated) >= self.max_new

    def describe(self) -> str:
        rule = "greedy" if self.temperature <= 0 else (
            f"T={self.temperature:g} top_k={self.top_k} top_p={self.top_p:g} seed={self.seed}")
        leave = f", leaves before step {self.leave}" if self.leave is not None else ""
        return f"{self.name}: prompt {len(self.prompt)} tokens, {rule}, joins at step {self.join}{leave}"


@dataclass
class Step:
    owners: int  # owners verified in this step
    tokens: int  # tokens committed by target_verify (sum of accepted + 1)
    acceptance: list[int]  # accepted + 1 per verified owner
    rows: list[int]  # rows verified per owner (pending + drafts)
    drafts: list[list[int]]  # draft_forward's drafts per owner (before an oracle replaces them)
    seconds: float  # wall time of every method call of the step (prefills of joiners included)


@dataclass
class Run:
    tokens: dict[str, list[int]]
    steps: list[Step]
    owners: list[Owner]

    def acceptance_length(self) -> float:
        lengths = [a for s in self.steps for a in s.acceptance]
        return sum(lengths) / max(len(lengths), 1)

    def tokens_per_step(self) -> float:
        busy = [s for s in self.steps if s.owners]
        return sum(s.tokens for s in busy) / max(len(busy), 1)

    def seconds_per_step(self) -> float:
        return sum(s.seconds for s in self.steps) / max(len(self.steps), 1)


class Program:
    """A DFlash program's methods called by name with named inputs and outputs."""

    def __init__(self, spec: methods.ProgramSpec, call: Callable[[str, list], list]):
        self.spec = spec
        self.methods = {m.name: m for m in spec.methods}
        self.constants = spec.constants
        self._call = call

    @classmethod
    def load(cls, spec: methods.ProgramSpec, directory: Path) -> "Program":
        """The `.pte` in `directory`, in executorch.runtime."""
        from executorch.runtime import Runtime

        program = Runtime.get().load_program(Path(directory) / artifact.PTE)
        loaded = {}  # each method loaded once (the KV caches live in the program's shared arena)

        def call(name, args):
            if name not in loaded:
                loaded[name] = program.load_method(name)
            return list(runtime_log.first_call(lambda: loaded[name].execute(args)))

        return cls(spec, call)

    @classmethod
    def eager(cls, spec: methods.ProgramSpec) -> "Program":
        """The spec's own modules in PyTorch (they share their caches like the program does)."""
        table = {m.name: m.module.eval() for m in spec.methods}

        def call(name, args):
            with torch.no_grad():
                out = table[name](*args)
            return list(out) if isinstance(out, tuple) else [out]

        return cls(spec, call)

    def __call__(self, name: str, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        m = self.methods[name]
        missing = [t.name for t in m.inputs if t.name not in inputs]
        if missing:
            raise TypeError(f"{name} needs inputs {missing}")
        out = self._call(name, [inputs[t.name] for t in m.inputs])
        return {t.name: v for t, v in zip(m.outputs, out)}


def _long(values) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64)


def _offsets(counts: list[int]) -> torch.Tensor:
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return _long(out)


def _sampling_inputs(program: Program, owners: list[Owner]) -> dict[str, torch.Tensor]:
    if program.constants["variant"] != "sampling":
        return {}
    return {
        "temperature": torch.tensor([o.temperature for o in owners], dtype=torch.float32),
        "top_k": _long(o.top_k for o in owners),
        "top_p": torch.tensor([o.top_p for o in owners], dtype=torch.float32),
        "seed": _long(o.seed for o in owners),
    }


def _check_owner(program: Program, owner: Owner) -> None:
    c = program.constants
    if not owner.prompt:
        raise ValueError(f"owner {owner.name} has an empty prompt; give it at least one token")
    if owner.max_new < 1:
        raise ValueError(f"owner {owner.name}: max_new must be >= 1, got {owner.max_new}")
    if len(owner.prompt) + owner.max_new > c["max_seq_len"]:
        raise ValueError(
            f"owner {owner.name}: prompt ({len(owner.prompt)}) + max_new ({owner.max_new}) exceeds the "
            f"program's max_seq_len ({c['max_seq_len']}); shorten one or export with a larger limits.max_seq_len"
        )
    bad = [t for t in owner.prompt if not 0 <= t < c["vocab_size"]]
    if bad:
        raise ValueError(f"owner {owner.name}: prompt tokens {bad[:5]} are outside the vocab [0, {c['vocab_size']})")
    if program.constants["variant"] == "greedy" and owner.temperature > 0:
        raise ValueError(
            f"owner {owner.name} asks for temperature {owner.temperature}; a greedy program only decodes greedily"
        )


def prefill(program: Program, joiners: list[Owner], speculative: bool) -> None:
    """Prompts of the joining owners, in calls of at most max_rows rows and max_owners owners."""
    max_rows, max_owners = program.constants["max_rows"], program.constants["max_owners"]
    done = {o.name: 0 for o in joiners}
    while any(done[o.name] < len(o.prompt) for o in joiners):
        batch, counts = [], []
        for o in joiners:
            left = len(o.prompt) - done[o.name]
            room = max_rows - sum(counts)
            if left and room and len(batch) < max_owners:
                batch.append(o)
                counts.append(min(left, room))
        starts = [done[o.name] for o in batch]
        tokens = _long(t for o, s, n in zip(batch, starts, counts) for t in o.prompt[s:s + n])
        rows = {"offsets": _offsets(counts), "start_position": _long(starts), "slots": _long(o.slot for o in batch)}
        out = program("target_prefill", tokens=tokens, **rows, **_sampling_inputs(program, batch))
        if speculative:
            stored = program("draft_prefill", hidden=out["hidden"], **rows)["stored"]
            if stored.tolist() != counts:
                raise RuntimeError(f"draft_prefill stored {stored.tolist()} rows, expected {counts}")
        for i, (o, s, n) in enumerate(zip(batch, starts, counts)):
            done[o.name] = s + n
            if done[o.name] == len(o.prompt):  # the last chunk decides the first token
                first = int(out["first_token"][i])
                if first < 0:
                    raise RuntimeError(f"target_prefill gave no first token for owner {o.name}")
                o.generated = [first]
                o.position = len(o.prompt)
                o.committed = 0


def _rows_per_owner(active: list[Owner], block_size: int, max_rows: int, speculative: bool) -> list[int]:
    """Rows to verify per owner: the pending token plus as many drafts as the block, the
    owner's budget and the call's row bound allow."""
    n = [min(block_size if speculative else 1, o.max_new - len(o.generated)) for o in active]
    while sum(n) > max_rows:
        n[n.index(max(n))] -= 1
    return n


def _admit(waiting: list[Owner], active: list[Owner], free: list[int], step: int, max_owners: int) -> list[Owner]:
    """Owners whose join step has come, while slots and the owner bound allow; each takes
    the lowest free slot (so a departed owner's slot is reused)."""
    joiners = []
    while waiting and waiting[0].join <= step and free and len(active) + len(joiners) < max_owners:
        o = waiting.pop(0)
        o.slot = min(free)
        free.remove(o.slot)
        joiners.append(o)
    return joiners


def _release(active: list[Owner], free: list[int], leaving) -> None:
    for o in [o for o in active if leaving(o)]:
        active.remove(o)
        free.append(o.slot)


def _draft(program: Program, active: list[Owner], hidden: torch.Tensor) -> list[list[int]]:  # hidden [R, F]
    """One draft_forward for every active owner: its committed rows of the last verify's
    `hidden` (none for a joiner) become context, then block_size - 1 drafts."""
    out = program(
        "draft_forward", hidden=hidden, hidden_start=_long(o.hidden_start for o in active),
        committed=_long(o.committed for o in active), pending=_long(o.generated[-1] for o in active),
        start_position=_long(o.position for o in active), slots=_long(o.slot for o in active),
    )
    return out["drafts"].tolist()


def _verify_and_commit(
    program: Program, active: list[Owner], rows: list[list[int]]
) -> tuple[list[int], torch.Tensor]:  # accepted + 1 per owner, hidden [R, F]
    """target_verify over each owner's [pending, drafts...]; commit the accepted drafts and
    next_token. Returns accepted + 1 per owner and the hidden rows for the next draft."""
    n = [len(r) for r in rows]
    offsets = _offsets(n)
    out = program(
        "target_verify", tokens=_long(t for r in rows for t in r), offsets=offsets,
        start_position=_long(o.position for o in active), slots=_long(o.slot for o in active),
        **_sampling_inputs(program, active),
    )
    accepted, next_token = out["accepted"].tolist(), out["next_token"].tolist()
    for i, o in enumerate(active):
        if next_token[i] < 0 or not 0 <= accepted[i] < n[i]:
            raise RuntimeError(
                f"target_verify gave accepted {accepted[i]}, next_token {next_token[i]} for owner {o.name} "
                f"with {n[i]} rows"
            )
        o.generated += rows[i][1:1 + accepted[i]] + [next_token[i]]
        o.hidden_start, o.committed = int(offsets[i]), accepted[i] + 1
        o.position += accepted[i] + 1
    return [a + 1 for a in accepted], out["hidden"]


def generate(
    program: Program,
    owners: list[Owner],
    mode: str = "speculative",
    oracle: dict[str, list[int]] | None = None,
    max_steps: int | None = None,
) -> Run:
    """Run the loop until every owner is done or has left (or `max_steps` steps).
    `oracle`: owner name -> tokens known to be right; they replace draft_forward's drafts."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    speculative = mode == "speculative"
    c = program.constants
    owners = [o.fresh() for o in owners]
    for o in owners:
        _check_owner(program, o)
    waiting = sorted(owners, key=lambda o: o.join)
    active: list[Owner] = []
    free = list(range(c["max_owners"]))
    hidden = torch.zeros(1, c["hidden_width"], dtype=methods.LOGITS_DTYPES[c["model_dtype"]])  # no verify yet
    steps: list[Step] = []
    while (waiting or active) and (max_steps is None or len(steps) < max_steps):
        t0 = time.perf_counter()
        step = len(steps)
        _release(active, free, lambda o: o.leave is not None and o.leave <= step)
        joiners = _admit(waiting, active, free, step, c["max_owners"])
        if joiners:
            prefill(program, joiners, speculative)
        active += joiners
        _release(active, free, lambda o: o.done)
        if not active:
            steps.append(Step(0, 0, [], [], [], time.perf_counter() - t0))
            continue
        drafts = _draft(program, active, hidden) if speculative else [[] for _ in active]
        n = _rows_per_owner(active, c["block_size"], c["max_rows"], speculative)
        rows = []
        for i, o in enumerate(active):
            proposed = oracle[o.name][len(o.generated):] if oracle is not None else drafts[i]
            rows.append([o.generated[-1]] + proposed[:n[i] - 1])
        lengths, hidden = _verify_and_commit(program, active, rows)
        steps.append(Step(len(active), sum(lengths), lengths, [len(r) for r in rows], drafts,
                          time.perf_counter() - t0))
    return Run({o.name: list(o.generated) for o in owners}, steps, owners)


def scenario(program: Program, seed: int, owners: int = 5) -> list[Owner]:
    """Owners with different prompts and sampling parameters (all greedy in a greedy
    program), joining and leaving mid-way: a prompt longer than max_rows (chunked
    prefill), an owner leaving before it is done, a later joiner reusing its slot with
    a shorter prompt (stale cache entries past its positions)."""
    c = program.constants
    g = torch.Generator().manual_seed(seed)
    vocab, max_seq_len, max_rows = c["vocab_size"], c["max_seq_len"], c["max_rows"]
    params = [
        dict(temperature=0.0),
        dict(temperature=0.8, top_k=40, top_p=0.9),
        dict(temperature=1.0),
        dict(temperature=0.6, top_k=5, top_p=0.95),
        dict(temperature=1.3, top_p=0.5),
    ]
    lengths = [7, max_rows + 6, 12, 3, 20]  # owner1's prompt takes two target_prefill calls
    joins = [0, 0, 1, 3, 4]
    leaves = [None, None, 3, None, None]
    out = []
    for i in range(min(owners, c["max_owners"])):
        k = i % len(params)
        prompt_len = min(lengths[k], max_seq_len - 8)
        max_new = min(24 + 4 * k, max_seq_len - prompt_len)
        p = params[k] if c["variant"] == "sampling" else dict(temperature=0.0)
        seed_i = int(torch.randint(-(1 << 62), 1 << 62, (1,), generator=g))
        prompt = torch.randint(0, vocab, (prompt_len,), generator=g).tolist()
        out.append(Owner(f"owner{i}", prompt, max_new, seed=seed_i, join=joins[k], leave=leaves[k], **p))
    return out


def compare(got: Run, want: Run, partial: bool = False) -> list[tuple[str, bool, str]]:
    """Per owner: got's tokens equal want's (a prefix of them for an owner that left early,
    or for every owner when `partial`: a run cut short by max_steps)."""
    out = []
    for o in got.owners:
        a, b = got.tokens[o.name], want.tokens[o.name]
        same = a == b[:len(a)] and (len(a) == len(b) or o.leave is not None or partial)
        where = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        out.append((o.name, same, "" if same else f"first difference at token {where}: {a[where:where + 4]} vs "
                                                 f"{b[where:where + 4]} (lengths {len(a)}, {len(b)})"))
    return out


def compare_drafts(got: Run, want: Run) -> str | None:
    """None when both runs drafted the same tokens at every step, else the first difference."""
    for i, (a, b) in enumerate(zip(got.steps, want.steps)):
        if a.drafts != b.drafts:
            return f"step {i}: drafts {a.drafts} vs {b.drafts}"
    if len(got.steps) != len(want.steps):
        return f"{len(got.steps)} steps vs {len(want.steps)}"
    return None


def run_cli(cfg: ExportConfig, artifact_dir: str | Path, steps: int = 8, seed: int = 0, stream=None) -> int:
    """`dflash-et run`: the speculative loop on the scenario of `seed`, with statistics."""
    stream = stream or sys.stdout
    if cfg.program != "dflash":
        raise ConfigError(
            f"dflash-et run drives a DFlash program (program: dflash); this config is a {cfg.program} "
            "program: use dflash-et check"
        )
    if steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {steps}")
    directory = Path(artifact_dir)
    artifact.open_checked(directory, cfg.digest())
    spec = builder.build(cfg)
    program = Program.load(spec, directory)
    owners = scenario(program, seed)
    run = generate(program, owners, max_steps=steps)
    c = program.constants
    print(f"speculative loop of {directory} ({cfg.variant}, block size {c['block_size']}, "
          f"{len(owners)} owners, {len(run.steps)} steps)", file=stream)
    for o in owners:
        print(f"  {o.describe()}", file=stream)
    print("step  owners  tokens  acceptance     wall ms", file=stream)
    for i, s in enumerate(run.steps):
        acc = " ".join(map(str, s.acceptance)) or "-"
        print(f"{i:>4}  {s.owners:>6}  {s.tokens:>6}  {acc:<13}  {s.seconds * 1e3:>7.1f}", file=stream)
    for o in run.owners:
        print(f"  {o.name} committed {len(o.generated)}: {' '.join(map(str, o.generated))}", file=stream)
    print(f"tokens/step {run.tokens_per_step():.2f}, mean acceptance length {run.acceptance_length():.2f} "
          f"(tokens per owner per verify, max {c['block_size']}), wall {run.seconds_per_step() * 1e3:.1f} ms/step",
          file=stream)
    # The same owners decoded target-only (the tokens every run must commit), and with those
    # tokens as drafts: the acceptance path at its upper bound.
    reference = generate(program, [o.fresh(join=0, leave=None) for o in owners], mode="target_only")
    same = all(ok for _, ok, _ in compare(run, reference, partial=True))
    oracle = generate(program, owners, oracle=reference.tokens, max_steps=steps)
    print(f"committed tokens {'equal' if same else 'DIFFER FROM'} target-only decoding; with known-right drafts: "
          f"tokens/step {oracle.tokens_per_step():.2f}, mean acceptance length {oracle.acceptance_length():.2f}, "
          f"wall {oracle.seconds_per_step() * 1e3:.1f} ms/step", file=stream)
    return 0 if same else 1
