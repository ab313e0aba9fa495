"""dflash-et: ExecuTorch export and lowering for DFlash speculative decoding."""

__version__ = "0.1.0"
