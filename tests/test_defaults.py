"""Each default of the package is written once, in ``calib_monai/defaults.py``: no function signature, dataclass
field, call or config dict of ``calib_monai`` or the bundle generator (``bundle_factory``) writes a default's literal
under one of the names it goes by (``num_bins=15``, ``"review_alpha": 0.05``, ``alpha: float = 0.05``); they name
the constant instead. Parsed with :mod:`ast`, so comments and docstrings may quote the numbers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from calib_monai import defaults

REPO = Path(__file__).resolve().parents[1]
SCANNED = (REPO / "calib_monai", REPO / "bundle_factory")
EXEMPT = {"calib_monai/defaults.py"}

#: each constant of defaults.py and the names (arguments, fields, config keys) its value is a default under
NAMES = {
    "NUM_BINS": ("num_bins", "n_bins"),
    "L1ACE_NUM_BINS": ("num_bins",),
    "TACE_THRESHOLD": ("threshold",),
    "LOW_CONFIDENCE": ("low_confidence", "confidence_threshold", "threshold"),
    "EMPTY_CLASS": ("empty_class",),
    "BAND_RADIUS": ("band_radius",),
    "VOLUME_COVERAGE": ("coverage",),
    "FEATURE_DIM": ("max_dim", "conformal_dim"),
    "RECALIBRATION_METHOD": ("method", "calibration_method"),
    "RECALIBRATION_VOXELS": ("voxels", "calibration_voxels"),
    "CROSSFIT": ("crossfit", "calibration_crossfit"),
    "CROSSFIT_FOLDS": ("folds", "crossfit_folds", "calibration_folds"),
    "CALIBRATION_SPLIT": ("split", "fit_share", "calibration_split"),
    "MAX_VOXELS": ("max_voxels",),
    "MAX_SLICES": ("max_slices",),
    "LTS_STEPS": ("steps", "lts_steps"),
    "MAX_REFERENCE": ("max_reference", "max_images"),
    "REVIEW_ALPHA": ("alpha", "review_alpha"),
    "REVIEW_VOLUME_FACTOR": ("volume_factor", "review_volume_factor"),
    "REVIEW_INPUT_CHECK": ("input_check", "review_input_check"),
    "REVIEW_FEATURE_CHECK": ("feature_check", "review_feature_check"),
    "REVIEW_SCORE_CHECK": ("score_check", "review_score_check"),
    "CONTOUR_ALPHA": ("contour_alpha",),
    "CONTOUR_EPSILON": ("epsilon", "contour_epsilon"),
    "CONTOUR_RISK": ("risk", "contour_risk"),
    "CASE_SCORE_BOUND_ALPHA": ("bound_alpha",),  # the anchor's alpha is named by its class, not by "alpha"
    "SITE_LABELS_MIN": ("site_labels_min",),
}


def _same(a: object, b: object) -> bool:
    """Equal values of the same kind: ``True`` is not ``1``, ``0`` is ``0.0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _written(tree: ast.AST) -> list[tuple[str, object, int]]:
    """``(name, literal, line)`` of every literal written under a name: argument defaults, class fields, call
    keywords (but switches), ``{"name": literal}`` entries and ``x.get("name", literal)``."""
    found = []

    def add(name: str, node: ast.AST | None) -> None:
        if isinstance(node, ast.Constant) and node.value is not None:
            found.append((name, node.value, node.lineno))

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            positional = args.posonlyargs + args.args
            for arg, default in zip(positional[len(positional) - len(args.defaults) :], args.defaults):
                add(arg.arg, default)
            for arg, default in zip(args.kwonlyargs, args.kw_defaults):
                add(arg.arg, default)
        elif isinstance(node, ast.ClassDef):
            for statement in node.body:
                if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                    add(statement.target.id, statement.value)
        elif isinstance(node, ast.Call):
            for keyword in node.keywords:  # a switch passed in a call states a fact (Split(crossfit=True))
                if keyword.arg is not None and not (
                    isinstance(keyword.value, ast.Constant) and isinstance(keyword.value.value, bool)
                ):
                    add(keyword.arg, keyword.value)
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "get" and len(node.args) == 2:
                key = node.args[0]
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    add(key.value, node.args[1])
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    add(key.value, value)
    return found


def repeated_defaults(source: str, where: str = "<source>") -> list[str]:
    """``"<where>:<line>: num_bins=15 (use NUM_BINS)"`` for every default's literal written under one of its names."""
    hits = []
    for name, value, line in _written(ast.parse(source)):
        for constant, names in NAMES.items():
            if name in names and _same(value, getattr(defaults, constant)):
                hits.append(f"{where}:{line}: {name}={value!r} (use calib_monai.defaults.{constant})")
    return hits


def test_every_default_is_registered_with_its_names():
    assert set(NAMES) == set(defaults.__all__)
    assert all(not name.startswith("_") for name in defaults.__all__)


def test_no_default_is_written_twice():
    hits = []
    for root in SCANNED:
        for path in sorted(root.rglob("*.py")):
            where = str(path.relative_to(REPO))
            if where not in EXEMPT:
                hits += repeated_defaults(path.read_text(), where)
    assert not hits, "a default written again instead of read from calib_monai/defaults.py:\n" + "\n".join(hits)


@pytest.mark.parametrize(
    "source",
    [
        "def f(num_bins: int = 15): ...",
        "def f(*, review_alpha=0.05): ...",
        "@dataclass\nclass A:\n    alpha: float = 0.05",
        "g(calibration_method='local_temperature')",
        "config = {'calibration_folds': 2}",
        "d.get('coverage', 0.95)",
        "def f(score_check: bool = True): ...",
        "def f(volume_factor=0): ...",
    ],
)
def test_a_planted_literal_is_found(source):
    assert len(repeated_defaults(source)) == 1, source


@pytest.mark.parametrize(
    "source",
    [
        "def f(num_bins: int = NUM_BINS): ...",
        "def f(num_bins: int = 10): ...",  # another value is another choice, not the default
        "def f(alpha: float = 0.1): ...",  # a loss's own alpha
        "def f(input_check: bool = False): ...",
        "def f(crossfit=1): ...",  # a number is not the switch
        "x = 15",
    ],
)
def test_other_values_and_the_names_pass(source):
    assert repeated_defaults(source) == [], source
