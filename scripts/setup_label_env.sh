#!/usr/bin/env bash
# Set up .venv-label, the MONAI Label environment of calib_monai/label (DEVELOPERS.md): CPU torch 2.13.0, monai 1.6.1,
# monailabel 0.8.5 without its sam2 extra and with the pins it needs beside monai 1.6.1, and calib_monai (editable).
# Idempotent: does nothing when the environment was made by this same recipe (a stamp holds the hash of the script's
# lines less comments).
# The app imports no torchvision (only MONAI Label's own BundleInferTask and sample transforms do), so none is
# installed: PyPI has no torchvision that imports beside the CPU torch 2.13.0 anyway.
set -euo pipefail
script="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$script")/.."
env_dir=.venv-label
stamp="$env_dir/.calib_monai_label_env"
recipe="$(grep -v '^[[:space:]]*#' "$script" | sha256sum | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$recipe" && -x "$env_dir/bin/monailabel" ]]; then
    exit 0  # the stamp is written last, after the imports below worked
fi

start=$SECONDS
rm -rf "$env_dir"
python3 -m venv "$env_dir"
pip=("$env_dir/bin/pip" install -qq --disable-pip-version-check)
# torch first: a plain torch requirement would pull the multi-GB CUDA build
"${pip[@]}" torch==2.13.0
# monailabel 0.8.5's requirements less sam2 (no CPU wheel chain here), numpymaxflow and ninja (scribbles) and shapely
# (pathology); pydicom, pynetdicom, dicomweb-client and numpy pinned below the majors that break it
"${pip[@]}" "numpy<2" "monai==1.6.1" "pydicom>=2.4.4,<3" "pynetdicom>=2.0.2,<3" "dicomweb-client[gcp]>=0.59.1,<0.60" \
    "pydicom-seg>=0.4.1" "uvicorn>=0.29.0" "fastapi>=0.110.2" "pydantic>=2.7.0" "pydantic-settings>=2.2.1" \
    "python-dotenv>=1.0.1" "python-multipart>=0.0.9" "httpx>=0.27.0" "schedule>=1.2.1" "timeloop>=1.0.2" \
    "expiringdict>=1.2.2" "expiring_dict>=1.1.0" "cachetools>=5.3.3" "watchdog>=4.0.0" "pynrrd>=1.0.0" \
    "girder-client>=3.2.3" "einops>=0.7.0" "pyyaml>=6.0.1" "filelock>=3.11.0" "passlib>=1.7.4" "pyjwt>=2.8.0" \
    "bcrypt>=4.1.2" "requests>=2.31.0" "requests-toolbelt>=1.0.0" "urllib3>=2.2.1" "google-auth>=2.29.0" \
    scikit-learn scipy psutil tqdm
"${pip[@]}" --no-deps monailabel==0.8.5
# calib_monai with its own requirements (itk, which MONAI Label's writer imports too; ignite, nibabel...)
"${pip[@]}" -e .
"$env_dir/bin/python" -c "import monailabel.app, calib_monai.label.infer" >/dev/null
echo "$recipe" >"$stamp"
echo "set up $env_dir in $((SECONDS - start)) s (serving it: docs/site.md)"
