"""A dependency-free progress bar that degrades to one line per item when not on a tty."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str = ""):
        self.total = max(total, 1)
        self.done = 0
        self.label = label
        self.t0 = time.perf_counter()
        self.tty = sys.stderr.isatty()

    def step(self, item: str, state: str) -> None:
        self.done += 1
        frac = self.done / self.total
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / frac - elapsed if frac else 0
        bar = "#" * int(30 * frac)
        line = f"{self.label}[{bar:<30}] {self.done}/{self.total} {elapsed:5.0f}s eta {eta:4.0f}s  {item}: {state}"
        if self.tty:
            sys.stderr.write("\r" + line[:160].ljust(160))
            if self.done == self.total:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
