"""``calib-monai`` command line (``python -m calib_monai.cli`` does the same).

Example::

    calib-monai export bundles/nacl_flare --checkpoint /path/to/model.pt --output_dir /tmp/export
    calib-monai slicer bundles/nacl_flare Phantom_0010_0000   # from bundles/nacl_flare/inference/
    calib-monai calibrate-probabilities preds/ labelsTr/ report/ --fit_predictions val/ --fit_labels labelsTr/
    calib-monai site show /path/to/deployment      # the site monitor's state: cases, value, alarm, evidence
    calib-monai site reset /path/to/deployment     # clear it (after re-validating at the site)
    calib-monai site label /path/to/deployment /path/to/labels  # re-anchor the case score from the site's labels
"""

from __future__ import annotations

import logging
import os
import sys
import traceback

from calib_monai.defaults import LOW_CONFIDENCE

__all__ = ["main", "slicer"]


def slicer(
    bundle_dir: str,
    case: str,
    inference_dir: str | None = None,
    output_dir: str | None = None,
    low_confidence: float = LOW_CONFIDENCE,
) -> dict[str, str]:
    """3D Slicer files of one case segmented by a bundle: ``<case>.seg.nrrd`` (the bundle's labels, plus a "low
    confidence" segment below ``low_confidence``) and ``<case>_confidence.nrrd``, from ``<case>_seg.nii.gz`` and
    ``<case>_conf.nii.gz`` in ``inference_dir`` (default ``<bundle>/inference``), written beside them unless
    ``output_dir`` is given. A case whose files record different sources is refused.
    """
    from pathlib import Path

    from calib_monai.export import bundle_label_names, slicer_files_from_inference

    inference_dir = inference_dir or str(Path(bundle_dir) / "inference")
    written = slicer_files_from_inference(
        inference_dir, case, bundle_label_names(bundle_dir), output_dir, low_confidence=low_confidence
    )
    return {key: str(path) for key, path in vars(written).items() if path is not None}


def main() -> None:
    """Entry point of the ``calib-monai`` console script (the commands of the module).

    An error ends the command with one line, ``calib-monai: error: <what is wrong and the fix>``, and exit code 2 for
    bad input, 1 for anything else; ``CALIB_MONAI_TRACEBACK=1`` prints the traceback before it.
    """
    import fire

    from calib_monai.export import export_bundle
    from calib_monai.recalibration.external import calibrate_probabilities
    from calib_monai.review.site_labels import label_site
    from calib_monai.review.site_monitor import reset_site, show_site

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    commands = {
        "export": export_bundle,
        "slicer": slicer,
        "calibrate-probabilities": calibrate_probabilities,
        "site": {"show": show_site, "reset": reset_site, "label": label_site},
    }
    try:
        fire.Fire(commands, name="calib-monai")  # fire prints the returned dict of written paths
    except Exception as err:  # one line, not a traceback; fire's own usage errors exit 2 before reaching here
        sys.exit(_report(err))


#: bad input (a path, a file, a value): exit code 2, as for a usage error; anything else: 1
INPUT_ERRORS = (ValueError, KeyError, TypeError, FileNotFoundError, NotADirectoryError, IsADirectoryError)


def _report(err: Exception) -> int:
    """Print ``err`` as one line (``error_line``) and return the exit code: 2 for bad input, 1 for a failure."""
    from calib_monai.bundle.errors import TRACEBACK_ENV, error_line

    if os.environ.get(TRACEBACK_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        traceback.print_exception(err)
    print(f"calib-monai: error: {error_line(err)}", file=sys.stderr)
    return 2 if isinstance(err, INPUT_ERRORS) else 1


if __name__ == "__main__":
    main()
