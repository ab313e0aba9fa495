"""ExecuTorch's CPU probe lines, kept off a user's terminal.

The first method call of a process makes ExecuTorch's threadpool, whose CPU probe
prints lines like `[cpuinfo_utils.cpp:125] CPU info and manual query on # of cpus dont
match.` on stderr from C++: noise a user cannot act on, at the top of `dflash-et check`
and `run`. `first_call(run)` runs the process's first method call with file descriptor 2
fed through a filter that drops those lines and passes every other line on as it comes
(so a native error printed just before a crash still shows).
"""

import contextlib
import os
import sys
import threading

PROBE = b"[cpuinfo_utils.cpp:"

_done = False


@contextlib.contextmanager
def without_probe_lines():
    """Within the block, stderr (fd 2, C++ writers included) loses the CPU probe's lines."""
    sys.stderr.flush()
    saved = os.dup(2)
    read_end, write_end = os.pipe()

    def forward():
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                if not line.startswith(PROBE):
                    os.write(saved, line)

    thread = threading.Thread(target=forward, daemon=True)
    thread.start()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer closes: the thread reads to the end
        thread.join()
        os.close(saved)


def first_call(run):
    """`run()`; the first time in this process without the CPU probe's lines."""
    global _done
    if _done:
        return run()
    _done = True
    with without_probe_lines():
        return run()
