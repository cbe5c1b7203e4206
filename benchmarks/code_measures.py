"""Print the code's measures (tests/test_code_measures.py holds them): functions over 50 lines with
their place, how many over 100, imports of the reference's modules from outside it, import cycles.

    python benchmarks/code_measures.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_code_measures import LONG, MAX_LINES, function_lengths, reference_internals_imported  # noqa: E402
from test_import_graph import find_cycle, import_graph  # noqa: E402


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lengths = function_lengths()
    long = [f for f in lengths if f[0] > LONG]
    print(f"commit {commit}: {len(lengths)} functions; over {LONG} lines: {len(long)}; "
          f"over {MAX_LINES}: {sum(n > MAX_LINES for n, _ in lengths)}")
    for n, where in long:
        print(f"  {n:4d} {where}")
    outside = reference_internals_imported()
    print(f"imports of runners/pytorch modules from outside it: {len(outside)}" + "".join(f"\n  {w}" for w in outside))
    graph = import_graph()
    cycle = find_cycle(graph)
    print(f"modules: {len(graph)}, import edges: {sum(len(v) for v in graph.values())}, cycle: {cycle or 'none'}")


if __name__ == "__main__":
    main()
