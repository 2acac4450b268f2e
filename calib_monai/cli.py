"""``calib-monai`` command line (``python -m calib_monai.cli`` does the same).

Example::

    calib-monai export bundles/nacl_flare
    calib-monai export bundles/nacl_flare --checkpoint /path/to/model.pt --output_dir /tmp/export
    calib-monai export --help
"""

from __future__ import annotations

import logging

__all__ = ["main"]


def main() -> None:
    """Entry point of the ``calib-monai`` console script: ``export`` is ``calib_monai.export.export_bundle``."""
    import fire

    from calib_monai.export import export_bundle

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # fire prints the returned dict of written paths
    fire.Fire({"export": export_bundle}, name="calib-monai")


if __name__ == "__main__":
    main()
