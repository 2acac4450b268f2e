"""README's two commands stay true: CI runs the test command verbatim, and the main command names real files."""

from __future__ import annotations

import re

from conftest import REPO_ROOT


def _commands() -> list[str]:
    readme = (REPO_ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(python3 -m venv .venv && [^\n]+)\n```", readme)


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
    """README's demo digits are the range over the seeds in docs/results/flare_demo/seeds.md (issue 31.4), and the
    line that tells a newcomer when something is wrong stays."""
    readme = " ".join((REPO_ROOT / "README.md").read_text().split())
    seeds = (REPO_ROOT / "docs" / "results" / "flare_demo" / "seeds.md").read_text()
    assert "(docs/results/flare_demo/seeds.md)" in readme
    assert "means something is wrong" in readme
    row = next(line for line in seeds.splitlines() if line.startswith("| range |"))
    final_dice, final_ece, best_dice, best_epoch = (cell.strip() for cell in row.split("|")[2:6])
    said = re.search(
        r"ended at val_mean_dice ([\d.-]+) and val_ece ([\d.-]+), and kept epoch ([\d-]+) \(val_mean_dice ([\d.-]+)\)",
        readme,
    )
    assert said, "README's demo paragraph no longer states the seeds' range"
    assert said.groups() == (final_dice, final_ece, best_epoch, best_dice)
    assert len([line for line in seeds.splitlines() if re.match(r"\| \d+ \|", line)]) >= 3  # three seeds at least
