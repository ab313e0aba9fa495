"""The roofline of a DFlash program's step methods (issue #26): the larger of (bytes a call
must move) / copy bandwidth and (FLOPs it must do) / bf16 matmul rate, both rates measured
on the GPU in the same run (`measure_rates`).

Per call (`step_terms`), from the model shapes and the owners' context lengths:
- `target_verify` over R rows (R = owners x block for a verify step, = owners for
  target-only decoding): every target weight and the lm_head read once; each owner's KV
  cells read once (the fused attention reads a slot once per run of rows); the logits
  written by the lm_head and read by the verify head. FLOPs: 2 x R x (layer weights +
  lm_head) plus the attention, 4 x heads x head_dim per (row, cell it sees).
- `draft_forward` over owners x block rows: the drafter's layers and `fc`, the target's
  lm_head over block - 1 rows per owner, the drafter's context cells.
Norms, RoPE, embeddings and the heads' arithmetic are left out (small against these).

The sequential floor (`Terms.sequential`): the attention and the dense layers run one after
the other (AOTInductor launches a call's kernels on one stream, each layer's attention between
its matmuls), so a call takes at least the attention's own roofline (its KV bytes, or its
FLOPs) plus the rest's (the weights and logits, or the matmuls' FLOPs). Where the memory and
compute terms are of a size, that sum is up to twice the roofline: the part of "x roofline"
that no faster kernel removes.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Terms:
    flops: float
    bytes: float
    attention_flops: float = 0.0  # (of flops and bytes: the attention's, QK^T and PV over the KV cells)
    attention_bytes: float = 0.0

    def seconds(self, copy_bytes_per_s: float, flops_per_s: float) -> tuple[float, float]:
        """(memory time, compute time): the roofline is the larger."""
        return self.bytes / copy_bytes_per_s, self.flops / flops_per_s

    def sequential(self, copy_bytes_per_s: float, flops_per_s: float) -> float:
        """The attention's roofline plus the rest's: the floor of kernels run one after the other."""
        attention = max(self.attention_bytes / copy_bytes_per_s, self.attention_flops / flops_per_s)
        rest = max((self.bytes - self.attention_bytes) / copy_bytes_per_s,
                   (self.flops - self.attention_flops) / flops_per_s)
        return attention + rest


def layer_weights(cfg) -> int:
    """Weights of one decoder layer (q, k, v, o projections and the SwiGLU MLP)."""
    q = cfg.hidden_size * cfg.num_heads * cfg.head_dim
    kv = cfg.hidden_size * cfg.num_kv_heads * cfg.head_dim
    return 2 * q + 2 * kv + 3 * cfg.hidden_size * cfg.intermediate_size


def _attention(cfg, layers: int, row_cells: float) -> float:
    """FLOPs of QK^T and PV for `row_cells` (row, cell) pairs summed over the rows."""
    return 4.0 * layers * cfg.num_heads * cfg.head_dim * row_cells


def _kv_bytes(cfg, layers: int, cells: float, element: int) -> float:
    return 2.0 * layers * cfg.num_kv_heads * cfg.head_dim * element * cells


def step_terms(target, drafter, owners: int, rows_per_owner: int, cells: list[float], element: int = 2,
               committed: int = 1) -> dict[str, Terms]:
    """{'target_verify': ..., 'draft_forward': ...} for `owners` owners of `rows_per_owner`
    rows each whose slots hold `cells` cells before the call (one entry per owner);
    `element`: bytes of a weight / cache / logit; `committed`: context rows each owner's
    draft_forward appends (accepted + 1)."""
    if len(cells) != owners:
        raise ValueError(f"cells has {len(cells)} entries for {owners} owners")
    rows = owners * rows_per_owner
    vocab, hidden = target.vocab_size, target.hidden_size
    # a row j of an owner with c cells sees c + j + 1 of them
    seen = sum(c * rows_per_owner + rows_per_owner * (rows_per_owner + 1) / 2 for c in cells)
    weights = target.num_layers * layer_weights(target) + vocab * hidden
    attention_flops = _attention(target, target.num_layers, seen)
    kv = _kv_bytes(target, target.num_layers, sum(cells) + rows, element)
    verify = Terms(flops=2.0 * rows * weights + attention_flops,
                   bytes=element * weights + kv + 2.0 * element * rows * vocab,
                   attention_flops=attention_flops, attention_bytes=kv)
    block = drafter.block_size
    block_rows, draft_rows = owners * block, owners * (block - 1)
    fc = len(drafter.target_layer_ids) * hidden * drafter.hidden_size
    draft_weights = drafter.num_layers * layer_weights(drafter)
    block_seen = sum(c * block + block * block for c in cells)  # a block query sees the context and the block
    attention_flops = _attention(drafter, drafter.num_layers, block_seen)
    kv = _kv_bytes(drafter, drafter.num_layers, sum(cells) + block_rows, element)
    draft = Terms(
        flops=2.0 * (block_rows * draft_weights + draft_rows * vocab * hidden + owners * committed * fc)
        + attention_flops,
        bytes=element * (draft_weights + vocab * hidden + fc) + kv + 2.0 * element * draft_rows * vocab,
        attention_flops=attention_flops, attention_bytes=kv)
    return {"target_verify": verify, "draft_forward": draft}


def copy_bandwidth() -> float:
    """Bytes per second of a large device-to-device copy (read + write) on the current GPU:
    the floor every benchmark here measures its kernels against."""
    import torch
    from triton.testing import do_bench

    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    return 2 * n / (do_bench(lambda: b.copy_(a), warmup=50, rep=400, return_mode="median") * 1e-3)


def measure_rates(rows: int, hidden: int, vocab: int) -> tuple[float, float]:
    """(`copy_bandwidth()`; bf16 matmul FLOP/s at the lm_head's shape [rows, hidden] x
    [hidden, vocab]) on the current GPU."""
    import torch
    from triton.testing import do_bench

    bandwidth = copy_bandwidth()
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16)
    mm_ms = do_bench(lambda: x @ w.t(), warmup=25, rep=200, return_mode="median")
    return bandwidth, 2.0 * rows * hidden * vocab / (mm_ms * 1e-3)
