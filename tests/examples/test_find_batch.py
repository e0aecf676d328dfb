"""The ``examples/find_batch.py`` script: prints the plan, then trains with the chosen batch."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers.scripts import run_example

ROOT = Path(__file__).resolve().parents[2]


def test_find_batch_example_prints_the_plan_and_trains_with_it(tmp_path: Path) -> None:
    out = run_example(ROOT / "examples" / "find_batch.py", "--smoke", cwd=tmp_path).stdout
    head = re.search(r"^batch size plan: micro-batch (\d+) x 1 device\(s\) x accumulate (\d+) "
                     r"= global 256 \(was 256 x 1 = 256\)", out, re.M)  # fmt: skip
    assert head, out
    micro, accumulate = int(head.group(1)), int(head.group(2))
    assert micro * accumulate == 256  # "keep" holds the global batch
    assert re.search(r"^\s+batch\s+phase\s+samples/s\s+peak memory\s+result$", out, re.M)
    sizes = re.findall(r"^\s+(\d+)\s+(?:double|cap)\s", out, re.M)
    assert sizes == ["2", "4", "8", "16", "32", "64"]  # the smoke cap is 64
    assert f"trained 2 optimizer steps with batch {micro} x accumulate {accumulate}" in out
