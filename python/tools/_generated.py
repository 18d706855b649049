"""What every generator of python/tools shares: write the generated file, or with --check say
in one line that the checked-in file is not what the generator makes of its source (CI runs
each with --check)."""
import pathlib
import sys
from typing import List

ROOT = pathlib.Path(__file__).resolve().parents[2]


def write_or_check(out: pathlib.Path, text: str, argv: List[str], source: str, script: str) -> int:
    """Writes text to out, or with --check in argv compares them (1: they differ)."""
    if "--check" in argv:
        if not out.exists() or out.read_text() != text:
            print(f"{out.relative_to(ROOT)} differs from {source}: run python/tools/{script}",
                  file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    return 0
