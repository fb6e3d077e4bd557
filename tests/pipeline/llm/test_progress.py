"""What the progress reports measure of a process."""

from __future__ import annotations

import subprocess
import sys

from pipeline.llm.progress import peak_rss_mb


def test_a_process_peak_memory_is_its_own_not_its_parents():
    """A job started by a large process (a benchmark that ran vLLM in itself) reports its own peak:
    getrusage's ru_maxrss would report the parent's, kept across fork and exec."""
    held = bytearray(1200 * 2**20)
    held[::4096] = b"\1" * len(held[::4096])  # touched: resident
    assert peak_rss_mb() > 1200
    child = subprocess.run(
        [sys.executable, "-c", "from pipeline.llm.progress import peak_rss_mb; print(peak_rss_mb())"],
        capture_output=True,
        text=True,
    )
    assert child.returncode == 0, child.stderr
    assert float(child.stdout) < 800, child.stdout  # its imports (Ray) take ~320 MB
    del held
