"""The equivalent-mutant list (tools/mutate/equivalent.txt) names each mutant by its file, its
mutation and its line's text, and by its line where several share those: a line that moved
leaves its entry pointing at another line, and the mutant it meant is counted a survivor (or,
worse, another is left out). Every entry must name a line that still carries its text."""
from __future__ import annotations

from pathlib import Path

from tools.mutate.outcomes import load_equivalents

ROOT = Path(__file__).resolve().parents[2]


def test_every_listed_equivalent_mutant_names_a_line_that_carries_its_text():
    stale = []
    for (file, snippet, label), lines in load_equivalents(ROOT / "tools/mutate/equivalent.txt").items():
        src = (ROOT / file).read_text().split("\n")
        for line in lines:
            if not (0 < line <= len(src) and src[line - 1].strip() == snippet):
                here = [i + 1 for i, text in enumerate(src) if text.strip() == snippet]
                stale.append(f"{file}:{line}: {label}  | {snippet}  (the text is at {here or 'no line now'})")
    assert not stale, "equivalent.txt entries to move or drop:\n" + "\n".join(stale)
