"""The size of the harness against the core, in lines of Python (docstrings included).

    python bench/size.py

The core is what ``import cogcal`` needs and the models (torch and numpy only): the private
helpers ``cogcal._*``, ``calibrators``, ``metrics``, ``losses``, ``cog``, ``posthoc``,
``health``, ``conformal`` and ``models``; the harness is everything around it: ``data``,
``runs``, ``train``, ``bench``, ``report``, ``commands`` and ``cli``
(docs/development.md, "The map"). Target: harness at most 2.5 times the core.
"""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "cogcal"
HARNESS = ("data", "runs", "train", "bench", "report", "commands", "cli.py")


def lines(paths: list[Path]) -> int:
    return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in paths)


def main() -> None:
    files = sorted(SRC.rglob("*.py"))
    top = {p: p.relative_to(SRC).parts[0] for p in files}
    harness = [p for p in files if top[p] in HARNESS]
    core = [p for p in files if top[p] not in HARNESS]
    h, c = lines(harness), lines(core)
    print(f"core {c:,} lines in {len(core)} files; harness {h:,} lines in {len(harness)} files")
    print(f"harness / core = {h / c:.2f} (target <= 2.5)")
    for name in sorted(set(top.values())):
        group = [p for p in files if top[p] == name]
        kind = "harness" if name in HARNESS else "core"
        print(f"  {name:16s} {kind:8s} {lines(group):6,}")


if __name__ == "__main__":
    main()
