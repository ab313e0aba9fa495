"""The DFlash program: target + drafter methods with the verify head fused in.

Methods (docs/CONTRACT.md is the full contract: shapes, buffers, the step loop):

    target_prefill(tokens, offsets, start_position, slots[, sampling]) -> first_token, hidden
    target_verify (tokens, offsets, start_position, slots[, sampling]) -> accepted, next_token, hidden
    draft_prefill (hidden, offsets, start_position, slots)             -> stored
    draft_forward (hidden, hidden_start, committed, pending, start_position, slots) -> drafts
    + the standalone heads of the variant, + constant methods

`[, sampling]` is `temperature, top_k, top_p, seed` (one per owner) in the
sampling variant and nothing in the greedy one. All four model methods are
traced from one target and one drafter instance, so their KV / context caches
have the same buffer names and the exporter shares them across methods
(`ProgramSpec.shared_state`). The target is a Llama-family model or a Qwen3.5
hybrid, whose recurrent state a verify call keeps for exactly the accepted rows
(on the device: the inputs and outputs are the same for both; portable only).
"""

import torch
from torch import nn

from . import heads, methods, models, sampling
from .config import ExportConfig
from .methods import MethodSpec, ProgramSpec, TensorSpec
from .models import dflash, layers, llama, packing

F32, I64 = torch.float32, torch.int64


def _sampling_specs() -> list[TensorSpec]:
    return [
        TensorSpec("temperature", F32, ("owners",)),
        TensorSpec("top_k", I64, ("owners",)),
        TensorSpec("top_p", F32, ("owners",)),
        TensorSpec("seed", I64, ("owners",)),
    ]


def _last_rows(offsets: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:  # [O+1] -> [O], [O]
    """Each owner's last row (clamped) and whether it has a valid, non-empty range."""
    a, b = offsets[:-1], offsets[1:]
    has_rows = (a >= 0) & (b > a) & (b <= num_rows)
    return torch.clamp(b - 1, 0, num_rows - 1), has_rows


class TargetPrefill(nn.Module):
    """Prompt rows -> each owner's first token (argmax of its last prompt row) and taps."""

    def __init__(self, target: models.Target | models.HybridTarget, taps: tuple[int, ...]):
        super().__init__()
        self.target, self.taps = target, taps

    def first_token_logits(
        self,
        tokens: torch.Tensor,  # [R] int64
        offsets: torch.Tensor,  # [O+1] int64
        start_position: torch.Tensor,  # [O] int64
        slots: torch.Tensor,  # [O] int64
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # logits [O, V], has_rows [O] bool, hidden [R, F]
        """The target over every row; the lm_head only over each owner's last row."""
        h, hidden = self.target(tokens, offsets, start_position, slots, self.taps)
        last, has_rows = _last_rows(offsets, tokens.shape[0])
        return self.target.logits(h[last]), has_rows, hidden

    def forward(
        self,
        tokens: torch.Tensor,  # [R] int64
        offsets: torch.Tensor,  # [O+1] int64
        start_position: torch.Tensor,  # [O] int64: position of each owner's first row
        slots: torch.Tensor,  # [O] int64
    ) -> tuple[torch.Tensor, torch.Tensor]:  # first_token [O] int64, hidden [R, F]
        logits, has_rows, hidden = self.first_token_logits(tokens, offsets, start_position, slots)
        token = sampling.greedy(sampling.sanitize(logits))
        return torch.where(has_rows, token, -1), hidden


class TargetPrefillSampling(TargetPrefill):
    """Like TargetPrefill, the first token sampled by `sample_rows` at last prompt position + 1
    with the owner's parameters: the rule target_verify applies to every later position."""

    def __init__(self, target: models.Target | models.HybridTarget, taps: tuple[int, ...], max_owners: int | None):
        super().__init__(target, taps)
        self.sample = heads.SampleRows(max_owners)  # N = owners

    def forward(
        self,
        tokens: torch.Tensor,  # [R] int64
        offsets: torch.Tensor,  # [O+1] int64
        start_position: torch.Tensor,  # [O] int64
        slots: torch.Tensor,  # [O] int64
        temperature: torch.Tensor,  # [O] float32
        top_k: torch.Tensor,  # [O] int64
        top_p: torch.Tensor,  # [O] float32
        seed: torch.Tensor,  # [O] int64
    ) -> tuple[torch.Tensor, torch.Tensor]:  # first_token [O] int64, hidden [R, F]
        logits, has_rows, hidden = self.first_token_logits(tokens, offsets, start_position, slots)
        position = start_position + offsets[1:] - offsets[:-1]  # last prompt position + 1
        token = self.sample(logits, position, temperature, top_k, top_p, seed)
        return torch.where(has_rows, token, -1), hidden


class TargetVerify(nn.Module):
    """The target over [pending, drafts] of every owner, fused with the greedy verify head.
    The target's rows are deferred: a hybrid target keeps `accepted + 1` of each owner's
    rows (its head's verdict, on the device) for its next call to commit (`qwen3_5`)."""

    def __init__(self, target: models.Target | models.HybridTarget, taps: tuple[int, ...]):
        super().__init__()
        self.target, self.taps = target, taps
        self.verify = heads.DFlashVerifyArgmax()

    def forward(
        self,
        tokens: torch.Tensor,  # [R] int64: per owner [pending, drafts...]
        offsets: torch.Tensor,  # [O+1] int64
        start_position: torch.Tensor,  # [O] int64: position of each pending token
        slots: torch.Tensor,  # [O] int64
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # accepted [O], next_token [O], hidden [R, F]
        h, hidden = self.target(tokens, offsets, start_position, slots, self.taps, defer=True)
        accepted, next_token = self.verify(self.target.logits(h), tokens, offsets)
        self.target.accept(slots, accepted + 1)
        return accepted, next_token, hidden


class TargetVerifySampling(nn.Module):
    """The target over [pending, drafts] of every owner, fused with `dflash_verify` under
    each owner's temperature / top-k / top-p / seed."""

    def __init__(self, target: models.Target | models.HybridTarget, taps: tuple[int, ...], max_rows: int | None):
        super().__init__()
        self.target, self.taps = target, taps
        self.verify = heads.DFlashVerify(max_rows)

    def forward(
        self,
        tokens: torch.Tensor,  # [R] int64: per owner [pending, drafts...]
        offsets: torch.Tensor,  # [O+1] int64
        start_position: torch.Tensor,  # [O] int64: position of each pending token
        slots: torch.Tensor,  # [O] int64
        temperature: torch.Tensor,  # [O] float32
        top_k: torch.Tensor,  # [O] int64
        top_p: torch.Tensor,  # [O] float32
        seed: torch.Tensor,  # [O] int64
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # accepted [O], next_token [O], hidden [R, F]
        h, hidden = self.target(tokens, offsets, start_position, slots, self.taps, defer=True)
        accepted, next_token = self.verify(
            self.target.logits(h), tokens, offsets, start_position, temperature, top_k, top_p, seed
        )
        self.target.accept(slots, accepted + 1)
        return accepted, next_token, hidden


def _stored(place: packing.Placement, num_owners: int, num_slots: int) -> torch.Tensor:  # -> [O] int64
    """Rows written into each owner's own slot (the scratch slot does not count)."""
    owner_ids = torch.arange(num_owners, dtype=torch.int64, device=place.owner.device)
    written = (place.write_slot < num_slots)[None, :] & (place.owner[None, :] == owner_ids[:, None])
    return written.sum(dim=1)


class DraftPrefill(nn.Module):
    """Target hidden taps of prompt rows -> the drafter's context cache (no drafting)."""

    def __init__(self, drafter: models.Drafter):
        super().__init__()
        self.drafter = drafter

    def forward(
        self,
        hidden: torch.Tensor,  # [R, F]: target_prefill's hidden, as it came out
        offsets: torch.Tensor,  # [O+1] int64: the offsets given to target_prefill
        start_position: torch.Tensor,  # [O] int64: likewise
        slots: torch.Tensor,  # [O] int64: likewise
    ) -> torch.Tensor:  # stored [O] int64
        d = self.drafter
        start, count = packing.offsets_to_ranges(offsets)
        place = packing.place_rows(hidden.shape[0], start, count, start_position, slots, d.slots, d.max_seq_len)
        d.store_context(hidden, place)
        return _stored(place, start.shape[0], d.slots)


class DraftForward(nn.Module):
    """Append each owner's committed rows to its context, then draft block_size - 1 tokens."""

    def __init__(self, drafter: models.Drafter, target: models.Target | models.HybridTarget):
        super().__init__()
        self.drafter = drafter
        self.embed_tokens = target.model.embed_tokens  # shared with the target (z-lab)
        self.lm_head = target.lm_head  # None when tied to the embedding
        self.mask_token_id = drafter.cfg.mask_token_id
        self.vocab_size = target.cfg.vocab_size
        self.greedy_rows = layers.GreedyRows()  # the drafts' argmax (dflash::greedy_rows in CUDA programs)

    def forward(
        self,
        hidden: torch.Tensor,  # [R, F]: the previous target_verify's hidden, as it came out
        hidden_start: torch.Tensor,  # [O] int64: first row of each owner in `hidden`
        committed: torch.Tensor,  # [O] int64: rows of each owner to append (accepted + 1; 0: none)
        pending: torch.Tensor,  # [O] int64: each owner's pending token (next_token)
        start_position: torch.Tensor,  # [O] int64: position of the pending token
        slots: torch.Tensor,  # [O] int64
    ) -> torch.Tensor:  # drafts [O, block_size - 1] int64
        d = self.drafter
        # The committed rows sit right before the pending token: positions P - committed .. P - 1.
        place = packing.place_rows(
            hidden.shape[0], hidden_start, committed, start_position - committed, slots, d.slots, d.max_seq_len
        )
        d.store_context(hidden, place)
        owners = pending.shape[0]
        masks = torch.full(
            (owners, d.cfg.block_size - 1), self.mask_token_id, dtype=torch.int64, device=pending.device
        )
        block = torch.cat([torch.clamp(pending, 0, self.vocab_size - 1).unsqueeze(1), masks], dim=1)
        states = d.block(self.embed_tokens(block), start_position, slots)
        return dflash.draft_tokens(states, llama.output_weight(self.embed_tokens, self.lm_head), self.greedy_rows)


def build(cfg: ExportConfig) -> ProgramSpec:
    target, drafter = models.load(cfg.model, cfg.limits)
    tcfg, dcfg = target.cfg, drafter.cfg
    taps = tuple(dcfg.target_layer_ids)
    dtype = models.DTYPES[cfg.model.dtype]
    width = dcfg.context_width
    sampling_variant = cfg.variant == "sampling"
    bound = methods.search_bound(cfg)  # the heads' scan bound (None: unrolled, for CUDA)
    sampling_in = _sampling_specs() if sampling_variant else []
    rows_in = [
        TensorSpec("tokens", I64, ("rows",)),
        TensorSpec("offsets", I64, ("owners+1",)),
        TensorSpec("start_position", I64, ("owners",)),
        TensorSpec("slots", I64, ("owners",)),
    ]
    hidden_out = TensorSpec("hidden", dtype, ("rows", width))
    first_rule = "sample_rows at last prompt position + 1" if sampling_variant else "argmax (greedy)"
    specs = [
        MethodSpec(
            "target_prefill",
            TargetPrefillSampling(target, taps, bound and cfg.limits.max_owners) if sampling_variant
            else TargetPrefill(target, taps),
            rows_in + sampling_in, [TensorSpec("first_token", I64, ("owners",)), hidden_out],
            notes=f"first token: {first_rule} of the owner's last prompt row; -1 for an owner without rows",
        ),
        MethodSpec(
            "target_verify",
            TargetVerifySampling(target, taps, bound) if sampling_variant
            else TargetVerify(target, taps),
            rows_in + sampling_in,
            [TensorSpec("accepted", I64, ("owners",)), TensorSpec("next_token", I64, ("owners",)), hidden_out],
            notes="fuses " + ("dflash_verify" if sampling_variant else "dflash_verify_argmax")
            + " (submodule `verify`)",
        ),
        MethodSpec(
            "draft_prefill", DraftPrefill(drafter),
            [TensorSpec("hidden", dtype, ("rows", width))] + rows_in[1:],
            [TensorSpec("stored", I64, ("owners",))],
            notes="writes the drafter's context K/V of every row; same offsets / start_position / slots "
            "as target_prefill",
        ),
        MethodSpec(
            "draft_forward", DraftForward(drafter, target),
            [
                TensorSpec("hidden", dtype, ("rows", width)),
                TensorSpec("hidden_start", I64, ("owners",)),
                TensorSpec("committed", I64, ("owners",)),
                TensorSpec("pending", I64, ("owners",)),
                TensorSpec("start_position", I64, ("owners",)),
                TensorSpec("slots", I64, ("owners",)),
            ],
            [TensorSpec("drafts", I64, ("owners", dcfg.block_size - 1))],
            notes="appends rows [hidden_start, hidden_start + committed) at positions start_position - committed "
            "+ j, then drafts positions start_position + 1 .. + block_size - 1 (argmax)",
        ),
    ]
    specs += methods.head_methods(cfg, tcfg.vocab_size, dtype)
    constants = {
        "contract_version": methods.CONTRACT_VERSION,
        "program": "dflash",
        "variant": cfg.variant,
        "model_dtype": cfg.model.dtype,
        "vocab_size": tcfg.vocab_size,
        "hidden_size": tcfg.hidden_size,
        "hidden_width": width,
        "num_target_layers": tcfg.num_layers,
        "target_layer_ids": list(taps),
        "block_size": dcfg.block_size,
        "mask_token_id": dcfg.mask_token_id,
        "max_rows": cfg.limits.max_rows,
        "max_owners": cfg.limits.max_owners,
        "max_seq_len": cfg.limits.max_seq_len,
        "max_context_len": cfg.limits.max_seq_len,
        "use_kv_cache": True,
        "enable_dynamic_shape": True,
    }
    dims = {"rows": (1, cfg.limits.max_rows), "owners": (1, cfg.limits.max_owners), "n": (1, cfg.limits.max_rows)}
    return ProgramSpec(specs, constants, dims, shared_state=True, trace_sizes=methods.trace_sizes(cfg))
