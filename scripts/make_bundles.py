"""Write every method x data set bundle of ``bundles/`` from ``bundle_factory`` (the one source of truth).

python scripts/make_bundles.py            # (re)write all bundles
python scripts/make_bundles.py --check    # exit 1 if a committed bundle differs from what would be written
"""

from __future__ import annotations

import sys
from pathlib import Path

import fire

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: bundle_factory/ is not installed
from bundle_factory import bundle_names, render_bundle, write_bundles  # noqa: E402

BUNDLES = Path(__file__).resolve().parents[1] / "bundles"


def out_of_sync(root: Path = BUNDLES) -> list[str]:
    """Files that differ from, are missing from, or are not part of the generated bundles."""
    problems = []
    for name in bundle_names():
        for rel, text in render_bundle(name).items():
            path = root / name / rel
            if not path.is_file():
                problems.append(f"missing: {path}")
            elif path.read_text() != text:
                problems.append(f"differs: {path}")
    generated = set(bundle_names())
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        if folder.name not in generated:
            problems.append(f"not generated (remove it or add it to bundle_factory/specs.py): {folder}")
    return problems


def main(check: bool = False, root: str = str(BUNDLES)) -> None:
    if check:
        problems = out_of_sync(Path(root))
        print("\n".join(problems) or f"all {len(bundle_names())} bundles are in sync")
        sys.exit(1 if problems else 0)
    written = write_bundles(root)
    print(f"wrote {len(written)} file(s) of {len(bundle_names())} bundles under {root}")


if __name__ == "__main__":
    fire.Fire(main)
