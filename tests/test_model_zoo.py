"""The MONAI model zoo's own CI checks (Project-MONAI/model-zoo, ``ci/``), on every bundle, each test named after one.

For a changed bundle the zoo's CPU premerge (``ci/run_premerge_cpu.sh``) runs, in this order:

1. ``ci/prepare_schema.py``: the metadata's ``schema`` URL, downloaded into the bundle's ``eval/schema.json``;
2. ``ci/get_bundle_requirements.py`` (``get_requirements``): pip requirements from ``configs/metadata.json``,
   installed with ``pip install --pre -r``;
3. ``ci/verify_bundle.py -m min``: ``verify_bundle_directory``, ``verify_version_changes``,
   ``verify_metadata_format``.

The full mode (the GPU premerge) adds ``verify_bundle_properties``, ``verify_data_shape`` and ``verify_torchscript``;
they run here on one bundle trained for one tiny epoch on phantoms. The checks are written from what the zoo's code
does (it is not copied): a bundle is laid out as the zoo's ``models/<bundle>/`` in a temporary folder with an empty
``models/model_info.json`` (no version of these bundles is released in the zoo). All offline: the schema is the copy
in ``../shared/monai`` and the one large file has no URL.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from monai.apps.utils import download_url
from monai.bundle import ConfigParser, ckpt_export, create_workflow, verify_metadata, verify_net_in_out
from packaging.requirements import Requirement

import calib_monai
from bundle_factory import bundle_names
from conftest import REPO_ROOT

pytestmark = [
    # loading the exported TorchScript is the point of verify_torchscript; torch >= 2.10 flags every torch.jit call
    pytest.mark.filterwarnings(r"ignore:`torch\.jit\.load` is deprecated:DeprecationWarning"),
    # the zoo's schema and large files carry no hash either: MONAI says so for every file it keeps
    pytest.mark.filterwarnings("ignore:No hash value provided"),
]

BUNDLES = REPO_ROOT / "bundles"
OFFLINE_SCHEMAS = REPO_ROOT.parent / "shared" / "monai"
NECESSARY_FILES = ("configs/metadata.json", "LICENSE")
WEIGHTS = "models/model.pt"
# one epoch on 6 coarse phantoms cropped to 32x32x8 (as tests/test_bundle_nacl_flare.py)
TINY = {
    "epochs": "1",
    "roi_size": "[32,32,8]",
    "batch_size": "8",
    "data#num_phantoms": "6",
    "data#spacing": "[12.0,12.0,30.0]",
}


# --- the zoo's checks ----------------------------------------------------------------------------------------------


def find_config(folder: Path, stem: str) -> Path | None:
    """``<stem>.json``, ``.yaml`` or ``.yml`` in ``folder`` (the zoo keeps the last of them that exists)."""
    found = [path for path in (folder / f"{stem}.{suffix}" for suffix in ("json", "yaml", "yml")) if path.is_file()]
    return found[-1] if found else None


def download_large_files(bundle: Path) -> None:
    """Every ``large_files`` entry through MONAI's ``download_url``, as the zoo passes it: ``filepath`` the bundle's
    ``path``, empty ``hash_val``/``hash_type`` dropped, ``fuzzy`` on. ``download_url`` keeps a file that is already
    there (once its hash, if any, matches) and fetches the ``url`` otherwise; any failure is the zoo's one error."""
    listing = find_config(bundle, "large_files")
    if listing is None:
        return
    for entry in ConfigParser.load_config_file(str(listing))["large_files"]:
        arguments = {key: value for key, value in entry.items() if not (key.startswith("hash_") and value == "")}
        try:
            download_url(filepath=bundle / arguments.pop("path"), fuzzy=True, **arguments)
        except Exception as error:
            raise ValueError(f"Download large files in {bundle} error.") from error


def verify_bundle_directory(models: Path, name: str) -> None:
    """The large files first, then the necessary files, then the preferred ones (weights, an inference config)."""
    bundle = models / name
    download_large_files(bundle)
    for file in NECESSARY_FILES:
        if not (bundle / file).exists():
            raise ValueError(f"necessary file {file} is not existing.")
    if find_config(bundle / "configs", "inference") is None:
        raise ValueError("inference config file is not existing.")
    if not (bundle / WEIGHTS).exists():
        raise ValueError(f"necessary file {WEIGHTS} is not existing.")


def verify_version_changes(models: Path, name: str) -> None:
    """``version`` and ``changelog`` present, the version in the changelog, and not a version the zoo released."""
    metadata = json.loads((models / name / "configs" / "metadata.json").read_text())
    for key in ("version", "changelog"):
        if key not in metadata:
            raise ValueError(f"'{key}' is missing in configs/metadata.json of bundle: {name}.")
    version = metadata["version"]
    if version not in metadata["changelog"]:
        raise ValueError(f"version number: {version} is missing in 'changelog' of bundle: {name}.")
    if f"{name}_v{version}" in json.loads((models / "model_info.json").read_text()):
        raise ValueError(f"version number: {version} is already used of bundle: {name}. Please change it.")


def prepare_schema(models: Path, name: str) -> None:
    """The metadata's schema into ``eval/schema.json``: the zoo downloads the URL; here, its offline copy."""
    url = json.loads((models / name / "configs" / "metadata.json").read_text())["schema"]
    offline = OFFLINE_SCHEMAS / url.rsplit("/", 1)[-1]
    if not offline.is_file():
        pytest.skip(f"offline copy of the metadata schema {url} not found at {offline}")
    (models / name / "eval").mkdir(exist_ok=True)
    shutil.copyfile(offline, models / name / "eval" / "schema.json")


def verify_metadata_format(models: Path, name: str) -> None:
    """MONAI's ``verify_metadata`` against ``eval/schema.json`` (present, so nothing is downloaded)."""
    bundle = models / name
    verify_metadata(meta_file=str(bundle / "configs" / "metadata.json"), filepath=str(bundle / "eval" / "schema.json"))


def _next_patch(version: str) -> str:
    parts = [int(p) for p in version.split(".")] + [0] * (3 - len(version.split(".")))
    return ".".join(str(p) for p in parts[:-1] + [parts[-1] + 1])


def get_requirements(models: Path, name: str, allow_monai_rc: bool = False) -> list[str]:
    """The requirement lines the zoo writes: monai (a release-candidate range when ``ALLOW_MONAI_RC``, as the CPU
    premerge sets it), torch, numpy, then ``name==version`` of the optional and required packages."""
    metadata = json.loads((models / name / "configs" / "metadata.json").read_text())
    monai = metadata["monai_version"]
    lines = [f"monai>={monai}rc1,<{_next_patch(monai)}" if allow_monai_rc else f"monai=={monai}"]
    lines += [f"torch=={metadata['pytorch_version']}", f"numpy=={metadata['numpy_version']}"]
    for key in ("optional_packages_version", "required_packages_version"):
        lines += [f"{package}=={version}" for package, version in metadata.get(key, {}).items()]
    return lines


def verify_bundle_min(models: Path, name: str) -> None:
    """``verify_bundle.py -m min``, after the schema step, in the zoo's order."""
    prepare_schema(models, name)
    verify_bundle_directory(models, name)
    verify_version_changes(models, name)
    verify_metadata_format(models, name)


# --- a bundle as the zoo lays it out -------------------------------------------------------------------------------


def zoo_copy(models: Path, name: str) -> Path:
    """The committed bundle (no run outputs) as ``models/<name>``, beside an empty ``model_info.json``."""
    models.mkdir(parents=True, exist_ok=True)
    (models / "model_info.json").write_text("{}\n")
    ignored = shutil.ignore_patterns("models", "runs", "eval", "inference", "__pycache__")
    return Path(shutil.copytree(BUNDLES / name, models / name, ignore=ignored))


@pytest.fixture(scope="module")
def initial_weights(tmp_path_factory):
    """``name -> model.pt`` of the bundle's network as built (one file per distinct network): it stands for what
    the bundle's training run writes, for the checks that only look for the file."""
    folder, made = tmp_path_factory.mktemp("initial_weights"), {}

    def weights(bundle: Path) -> Path:
        config = json.loads((bundle / "configs" / "inference.json").read_text())
        key = json.dumps([config[k] for k in ("network_def", "backbone", "in_channels", "num_classes", "roi_size")])
        if key not in made:
            parser = ConfigParser()
            parser.read_config(str(bundle / "configs" / "inference.json"))
            parser["bundle_root"] = str(bundle)
            made[key] = folder / f"{len(made)}.pt"
            torch.save(parser.get_parsed_content("network_def").state_dict(), made[key])
        return made[key]

    return weights


def as_trained(bundle: Path, weights: Path) -> None:
    (bundle / "models").mkdir(exist_ok=True)
    os.link(weights, bundle / WEIGHTS)  # a hard link: 90 bundles, one file per network


# --- verify_bundle.py -m min on every bundle -----------------------------------------------------------------------


@pytest.mark.parametrize("name", bundle_names())
def test_verify_bundle_directory(name, tmp_path, initial_weights):
    bundle = zoo_copy(tmp_path / "models", name)
    as_trained(bundle, initial_weights(bundle))
    before = (bundle / WEIGHTS).read_bytes()
    verify_bundle_directory(tmp_path / "models", name)
    assert (bundle / WEIGHTS).read_bytes() == before  # kept: the large-file step downloaded nothing
    entries = ConfigParser.load_config_file(str(bundle / "large_files.yml"))["large_files"]
    assert entries == [{"path": WEIGHTS, "url": "", "hash_val": "", "hash_type": ""}]


def test_verify_bundle_directory_before_training(tmp_path):
    """Untrained, the bundle fails where its large_files.yml says (no URL to fetch the weights from); without that
    file it would fail at the preferred-file check, as the committed bundles did before it existed."""
    bundle = zoo_copy(tmp_path / "models", "nacl_flare")
    with pytest.raises(ValueError, match="Download large files in .* error"):
        verify_bundle_directory(tmp_path / "models", "nacl_flare")
    (bundle / "large_files.yml").unlink()
    with pytest.raises(ValueError, match="necessary file models/model.pt is not existing"):
        verify_bundle_directory(tmp_path / "models", "nacl_flare")


@pytest.mark.parametrize("name", bundle_names())
def test_verify_version_changes(name, tmp_path):
    zoo_copy(tmp_path / "models", name)
    verify_version_changes(tmp_path / "models", name)


def test_verify_version_changes_refuses_a_released_version(tmp_path):
    bundle = zoo_copy(tmp_path / "models", "crac_acdc")
    version = json.loads((bundle / "configs" / "metadata.json").read_text())["version"]
    (tmp_path / "models" / "model_info.json").write_text(json.dumps({f"crac_acdc_v{version}": {}}))
    with pytest.raises(ValueError, match="already used"):
        verify_version_changes(tmp_path / "models", "crac_acdc")


@pytest.mark.parametrize("name", bundle_names())
def test_verify_metadata_format(name, tmp_path):
    zoo_copy(tmp_path / "models", name)
    prepare_schema(tmp_path / "models", name)
    verify_metadata_format(tmp_path / "models", name)


# --- the requirement step before it ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", bundle_names())
def test_get_requirements(name):
    for allow_monai_rc in (False, True):
        requirements = [Requirement(line) for line in get_requirements(BUNDLES, name, allow_monai_rc)]
        assert all(not r.url and not r.marker for r in requirements)  # plain name and version: what pip gets
        pins = {r.name: str(r.specifier) for r in requirements}
        assert pins["calib-monai"] == f"=={calib_monai.__version__}"  # the project's own version


def test_get_requirements_installs_nothing_for_the_installed_project(tmp_path):
    """calib-monai is not on PyPI: its line is installable once the project is installed from its repository. pip,
    with no index at all, finds it satisfied (the other pins are PyPI packages)."""
    line = next(line for line in get_requirements(BUNDLES, "nacl_flare") if line.startswith("calib-monai=="))
    (tmp_path / "requirements_nacl_flare.txt").write_text(line + "\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--pre",
            "--no-index",
            "--dry-run",
            "--disable-pip-version-check",
            "-r",
            str(tmp_path / "requirements_nacl_flare.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Requirement already satisfied: {line}" in result.stdout
    assert "Would install" not in result.stdout


# --- what the zoo asks of a bundle's documents (CONTRIBUTING.md, docs/readme_template.md) ---------------------------

TEMPLATE_SECTIONS = (
    "Authors",
    "Tags",
    "Model Description",
    "Data",
    "Performance",
    "System Configuration",
    "Limitations",
    "References",
    "License",
)


@pytest.mark.parametrize("name", bundle_names())
def test_readme_and_data_license(name):
    readme = (BUNDLES / name / "docs" / "README.md").read_text()
    headings = {line.lstrip("#").strip().strip("*") for line in readme.splitlines() if line.startswith("#")}
    assert set(TEMPLATE_SECTIONS) <= headings, sorted(set(TEMPLATE_SECTIONS) - headings)
    terms = (BUNDLES / name / "docs" / "data_license.txt").read_text()
    assert "License: " in terms and "Cite when you use the data:" in terms
    for folder in (line.split("`")[1] for line in readme.splitlines() if line.startswith("- `docs/results/")):
        assert (REPO_ROOT / folder).is_file(), folder  # Performance points at recorded results only


# --- the full mode, on one bundle its own training run has given weights ------------------------------------------


@pytest.fixture(scope="module")
def trained_zoo_bundle(tmp_path_factory):
    """nacl_flare as ``models/nacl_flare`` after one tiny epoch of its own training command: ``models/model.pt`` is
    where ``large_files.yml`` says the training run writes it (no ``--output_dir``)."""
    models = tmp_path_factory.mktemp("zoo") / "models"
    bundle = zoo_copy(models, "nacl_flare")
    command = [
        sys.executable,
        "-m",
        "monai.bundle",
        "run",
        "training",
        "--config_file",
        str(bundle / "configs" / "train.json"),
        "--data#cache_dir",
        str(models.parent / "phantoms"),
    ]
    for key, value in TINY.items():
        command += [f"--{key}", value]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(command, cwd=models.parent, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return models, bundle


def test_verify_bundle_min_mode_after_training(trained_zoo_bundle):
    models, bundle = trained_zoo_bundle
    assert (bundle / WEIGHTS).is_file()
    verify_bundle_min(models, "nacl_flare")


def test_verify_bundle_properties(trained_zoo_bundle):
    """The zoo checks the inference workflow's properties for each app of ``supported_apps`` (none here, so it
    checks nothing); MONAI's inference and meta properties stand for an app's list."""
    _, bundle = trained_zoo_bundle
    assert json.loads((bundle / "configs" / "metadata.json").read_text())["supported_apps"] == {}
    workflow = create_workflow(
        workflow_type="inference",
        config_file=str(bundle / "configs" / "inference.json"),
        meta_file=str(bundle / "configs" / "metadata.json"),
        bundle_root=str(bundle),
        logging_file=str(bundle / "configs" / "logging.conf"),
    )
    assert workflow.check_properties() == []


def test_verify_data_shape(trained_zoo_bundle):
    _, bundle = trained_zoo_bundle
    verify_net_in_out(
        net_id="network_def",
        meta_file=str(bundle / "configs" / "metadata.json"),
        config_file=str(bundle / "configs" / "inference.json"),
        bundle_root=str(bundle),
    )


def test_verify_torchscript(trained_zoo_bundle):
    _, bundle = trained_zoo_bundle
    exported = bundle / "models" / "verify_model.ts"
    ckpt_export(
        net_id="network_def",
        filepath=str(exported),
        ckpt_file=str(bundle / WEIGHTS),
        meta_file=str(bundle / "configs" / "metadata.json"),
        config_file=str(bundle / "configs" / "inference.json"),
        bundle_root=str(bundle),
    )
    torch.jit.load(str(exported))
    if (bundle / "models" / "model.ts").is_file():  # written by the bundle's `export`; the zoo loads it when there
        torch.jit.load(str(bundle / "models" / "model.ts"))
