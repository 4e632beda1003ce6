"""The line format of the files the crash tests' child appends to (`child.py`), shared by
the child and the checker (`test_kill.py`).

Every line ends with END: a SIGKILL can cut a write short (the kernel stops copying
between pages once a fatal signal is pending), leaving part of a line that the next
life's first line would otherwise continue. Only lines that end with END count; each
life starts its files with a newline, which ends such a fragment.
"""

from __future__ import annotations

END = " ."


def whole_lines(text: str) -> list[str]:
    """The lines written in full, without END (a line cut short by a kill is dropped)."""
    return [line[: -len(END)] for line in text.splitlines() if line.endswith(END)]
