"""MONAI Label app serving the calib-monai bundles linked into its ``model/`` folder, offline (``docs/site.md``)::

    monailabel start_server --app calib_monai/label --studies /path/to/images --conf zoo_source local --conf models all

Every folder of ``<app>/model/`` holding ``configs/inference.json`` is a served bundle. Errors a client can fix are a
4xx with a ``detail`` message; a failed request leaves no upload behind, and the server goes on serving.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from fastapi import HTTPException
from monailabel.interfaces.app import MONAILabelApp
from monailabel.interfaces.exception import ImageNotFoundException, MONAILabelError, MONAILabelException

import calib_monai
from calib_monai.label.activelearning import CaseQualityScoring, LeastConfident, MostTypical, TypicalLeastConfident
from calib_monai.label.infer import TASKS, BundleTask
from calib_monai.label.labels import check_label
from calib_monai.label.routes import check_infer_route, check_label_route, remove_uploads, uploaded_fields
from calib_monai.label.serving import SITE_FOLDER, InputError, ServedBundle, find_bundles
from calib_monai.label.train import BundleTrainer

logger = logging.getLogger(__name__)


class CalibMONAILabelApp(MONAILabelApp):
    """The annotation loop for every bundle of ``<app_dir>/model``: four infer tasks, a scoring method and Next Sample
    strategies by case quality, and a train task that fine-tunes, calibrates and serves the new weights.

    Conf (``--conf key value``): ``models`` (``all``, the default, or comma-separated bundle folder names),
    ``zoo_source`` (only ``local``) and ``recent_s`` (seconds an image handed out by Next Sample stays reserved for
    its annotator, default 3600).
    """

    def __init__(self, app_dir: str, studies: str, conf: dict[str, str]):
        conf = conf or {}
        source = conf.get("zoo_source", "local")
        if source != "local":
            raise MONAILabelException(
                MONAILabelError.APP_INIT_ERROR,
                f"zoo_source {source!r}: this app serves local bundles only (--conf zoo_source "
                "local), linked or copied into its model/ folder",
            )
        self.model_dir = os.path.join(app_dir, "model")
        found = find_bundles(self.model_dir)
        wanted = conf.get("models", "all").strip()
        names = sorted(found) if wanted in ("", "all") else [n.strip() for n in wanted.split(",") if n.strip()]
        missing = [n for n in names if n not in found]
        if missing:
            raise MONAILabelException(
                MONAILabelError.APP_INIT_ERROR,
                f"--conf models names {missing}, not bundle folders of {self.model_dir} "
                f"(found: {sorted(found) or 'none'})",
            )
        if not names:
            logger.warning(f"no bundle in {self.model_dir}: link one there (a folder with configs/inference.json)")
        site_root = Path(studies if os.path.isdir(studies) else app_dir) / SITE_FOLDER  # one site monitor per bundle
        self.served = {name: ServedBundle(found[name], site_dir=site_root / name) for name in names}
        self.recent_s = float(conf.get("recent_s", 3600))
        check_infer_route()
        check_label_route(self.check_label)
        super().__init__(
            app_dir=app_dir,
            studies=studies,
            conf=conf,
            name="calib-monai",
            description="Calibrated segmentation: labels and their confidence",
            version=calib_monai.__version__,
        )

    def info(self):
        """MONAI Label's app info, and each served bundle's site monitor (cases seen, alarm and its message)."""
        meta = super().info()
        meta["calib_monai_site"] = {name: served.site_status() for name, served in self.served.items()}
        return meta

    def init_infers(self):
        tasks = {}
        for name, served in self.served.items():
            if served.weights is None:
                logger.warning(served.missing_weights_message())
            tasks.update({name + suffix: BundleTask(served, suffix) for suffix in TASKS})
        return tasks

    def init_trainers(self):
        return {name: BundleTrainer(served) for name, served in self.served.items()}

    def init_scoring_methods(self):
        return {f"{name}_case_quality": CaseQualityScoring(served) for name, served in self.served.items()}

    def init_strategies(self):
        # not MONAI Label's "random": a 500 when every unlabelled image was handed out within the same second
        strategies = {}
        for name in self.served:  # the most typical first: Slicer's Next Sample uses the first strategy listed
            for strategy in (MostTypical, TypicalLeastConfident, LeastConfident):
                strategies[f"{name}_{strategy.suffix}"] = strategy(name, self.recent_s)
        return strategies

    def train(self, request):
        """MONAI Label's ``train``, then the trained bundle's scoring here (MONAI Label's own re-scoring asks for every
        method at once, and all but the first are refused with a 429)."""
        auto, self._auto_update_scoring = self._auto_update_scoring, False
        try:
            result = super().train(request)
        except Exception as err:  # noqa: BLE001 - every failure gets its one line
            _one_line_failure(err)
            raise
        finally:
            self._auto_update_scoring = auto
        method = self._scoring_methods.get(f"{request.get('model')}_case_quality")
        if method is not None:
            scores = method({"method": f"{request.get('model')}_case_quality"}, self.datastore())
            result = {**(result or {}), "scored_images": len(scores)}
        if isinstance(result, dict) and "trained_on" in result:  # last in the status' details, which Slicer shows
            logger.info(
                f"{request.get('model')}: done: trained on {result['trained_on']} submitted label(s), validated and "
                f"calibrated on {result['validated_on']} held out and {result.get('source_validation', 0)} source "
                f"validation volume(s) ({result.get('calibration_method')}), scored "
                f"{result.get('scored_images', 0)} unlabelled image(s)"
            )
        return result

    def check_label(self, image_id: str, label: str, params: dict) -> None:
        """A submitted final label must lie on its image's grid and a served bundle must know its segment names; else
        a 422 naming what is wrong, and nothing is saved."""
        try:
            image = self.datastore().get_image_uri(image_id)
        except Exception:  # noqa: BLE001 - an unknown image: MONAI Label's own route answers that
            return
        if not image or not self.served:
            return
        refusals: dict[str, list[str]] = {}  # message -> the bundles that give it
        for name, served in self.served.items():
            try:
                check_label(label, image, params.get("label_info"), served.label_names, image_id)
                return
            except ValueError as err:
                refusals.setdefault(str(err), []).append(name)
        detail = "; ".join(f"{', '.join(names)}: {message}" for message, names in refusals.items())
        raise HTTPException(status_code=422, detail=f"{detail}; nothing was saved")

    def on_save_label(self, image_id, label_id):
        """A saved final label re-anchors the case score of each served bundle that knows its segments; the answer says,
        per bundle, the site's labels or why not. Saving never fails because of it."""
        out = super().on_save_label(image_id, label_id) or {}
        datastore = self.datastore()
        if datastore.get_labels_by_image_id(image_id).get("final") != label_id:
            return out
        label = datastore.get_label_uri(image_id, "final")
        label_info = datastore.get_label_info(image_id, "final").get("label_info")
        image = datastore.get_image_uri(image_id)
        anchored = {}
        for name, served in self.served.items():
            try:
                state = served.add_site_label(image_id, image, label, label_info)
                anchored[name] = {"labels": state["labels"], "alarm": state["alarm"]}
            except Exception as err:  # noqa: BLE001 - the label is saved whatever the re-anchoring says
                logger.warning(f"{name}: the label of {image_id} does not re-anchor the case score: {err}")
                anchored[name] = {"not_counted": str(err)}
        return {**out, "calib_monai_site_labels": anchored}

    def next_sample(self, request):
        """MONAI Label's Next Sample without re-scoring every image on each click (scores are kept up to date at start,
        after each training and on request). No strategy named: the first listed; an unknown one: 404."""
        strategy = request.get("strategy") or next(iter(self._strategies), None)  # MONAI Label's own: "random"
        if strategy not in self._strategies:
            detail = f"no Next Sample strategy {strategy!r} here; strategies: {list(self._strategies)}"
            raise HTTPException(status_code=404, detail=detail)
        auto, self._auto_update_scoring = self._auto_update_scoring, False
        try:
            return super().next_sample({**request, "strategy": strategy})
        finally:
            self._auto_update_scoring = auto

    def infer(self, request, datastore=None):
        """MONAI Label's ``infer``, the client's errors as a 4xx; a failed request's uploads are removed."""
        try:
            return self._infer(request, datastore)
        except BaseException:
            remove_uploads(request, uploaded_fields.get())
            raise

    def _infer(self, request, datastore=None):
        model = request.get("model")
        task = self._infers.get(model)
        if task is None:
            served = sorted(k for k, t in self._infers.items() if t.is_valid())
            raise HTTPException(status_code=404, detail=f"no model {model!r} here; served models: {served}")
        if not task.is_valid():
            raise HTTPException(status_code=404, detail=task.served.missing_weights_message())
        try:
            return super().infer(request, datastore)
        except InputError as err:
            raise HTTPException(status_code=err.status, detail=str(err)) from err
        except ImageNotFoundException as err:  # an image id that the datastore does not have
            raise HTTPException(status_code=404, detail=err.msg) from err


def _one_line_failure(err: BaseException) -> None:
    """In MONAI Label's training subprocess, end a failed training with one line ``ERROR: ...``, last in the task's
    ``details``; in the server, raise on."""
    if sys.modules.get("monailabel.app") is not None:
        return
    if isinstance(err, HTTPException):
        err = RuntimeError(err.detail)
    message = " ".join(str(getattr(err, "msg", None) or err).split())
    logger.info(f"training failed: {type(err).__name__}")
    print(f"ERROR: {message}", flush=True)
    os._exit(1)
