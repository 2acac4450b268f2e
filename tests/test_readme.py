"""README stays true and short: its two commands are its only shell blocks, CI runs the test command verbatim, the main
command names real files, the demo's digits are the measured range, every link resolves, and it fits in 200 lines."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO_ROOT


def _commands() -> list[str]:
    readme = (REPO_ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(python3 -m venv .venv && [^\n]+)\n```", readme)


def test_readme_runs_only_its_two_commands_and_fits_in_200_lines():
    """Every shell block of README is one of the two set-up commands (the tests below and CI run them), so no
    command in README goes unchecked; the rest lives in the guides, whose blocks tests/test_docs.py runs."""
    readme = (REPO_ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh|shell|console)\b[^\n]*\n(.*?)```", readme, re.S)
    assert [block.strip() for block in blocks] == _commands(), "README has a shell block besides its two commands"
    assert len(_commands()) == 2
    assert len(readme.splitlines()) <= 200, "README is for users in five minutes: move detail to docs/"


def test_readme_has_the_two_set_up_commands_first():
    main, tests = _commands()[:2]
    assert "monai.bundle run training" in main
    assert "pytest" in tests
    for command in (main, tests):
        # torch pinned before anything that depends on it
        assert command.index("torch==2.13.0") < command.index("pip install -q -e")


def test_ci_runs_readme_test_command_verbatim():
    tests = _commands()[1]
    ci_lines = (REPO_ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci_lines


def test_main_command_config_files_exist():
    main = _commands()[0]
    for path in re.findall(r"bundles/[\w/]+\.json", main):
        assert (REPO_ROOT / path).is_file(), path


def test_demo_paragraph_states_the_measured_range_of_seeds():
    """README's demo digits are the range over the seeds and machines in docs/results/flare_demo/seeds.md, README
    says the epoch kept varies by machine, and the line that tells a newcomer when something is wrong stays."""
    readme = " ".join((REPO_ROOT / "README.md").read_text().split())
    seeds = (REPO_ROOT / "docs" / "results" / "flare_demo" / "seeds.md").read_text()
    assert "(docs/results/flare_demo/seeds.md)" in readme
    assert "means something is wrong" in readme
    assert "varies by machine" in readme
    row = next(line for line in seeds.splitlines() if line.startswith("| range |"))
    final_dice, final_ece, best_dice, best_epoch = (cell.strip() for cell in row.split("|")[2:6])
    said = re.search(
        r"ended at val_mean_dice ([\d.-]+) and val_ece ([\d.-]+), and kept epoch ([\d-]+) \(val_mean_dice ([\d.-]+)\)",
        readme,
    )
    assert said, "README's demo paragraph no longer states the seeds' range"
    assert said.groups() == (final_dice, final_ece, best_epoch, best_dice)
    assert len([line for line in seeds.splitlines() if re.match(r"\| \d+ \|", line)]) >= 3  # three seeds at least


def _links(doc: Path) -> list[str]:
    """The relative link targets of a Markdown page (images too), less web addresses."""
    targets = re.findall(r"\]\(([^)\s]+)\)", doc.read_text())
    return [t for t in targets if not re.match(r"[a-z]+:", t)]


def _anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", doc.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_link_of_readme_and_the_results_index_resolves():
    for page in (REPO_ROOT / "README.md", REPO_ROOT / "docs" / "results" / "README.md"):
        broken = []
        for target in _links(page):
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists() or (anchor and file.suffix == ".md" and anchor not in _anchors(file)):
                broken.append(target)
        assert not broken, f"{page.relative_to(REPO_ROOT)} links to what is not there: {broken}"
