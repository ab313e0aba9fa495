"""Errors of the lowering step that a user can act on (the CLI prints them without a trace)."""


class LoweringError(RuntimeError):
    """The lowering cannot run or refused the program; the message says why and what to do."""
