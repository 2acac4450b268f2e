"""``InferenceSummary``, the last line of ``inferring``, on a real Ignite engine whose outputs are the post-processed
items the bundles' evaluator gives: counts worked out from the items by hand."""

from __future__ import annotations

import logging

from ignite.engine import Engine

from calib_monai.handlers import InferenceSummary

NO_RANGE = "cannot judge: no validated range at models/validated_range.json: run the bundle's calibrate step"


def _run(batches, caplog) -> str:
    engine = Engine(lambda engine, batch: batch)  # the output is the batch: a list of post-processed items
    InferenceSummary("out").attach(engine)
    with caplog.at_level(logging.INFO, logger="calib_monai"):
        engine.run(batches, max_epochs=1)
    return caplog.records[-1].getMessage()


def _item(flag, site=None, reasons=()):
    return {"quality": {"review": {"flag": flag, "reasons": list(reasons)}, **({"site": site} if site else {})}}


def test_the_line_counts_cases_flags_and_says_the_site_verdict(caplog):
    site = {"monitored": True, "cases": 4, "alarm": True, "message": "the site drifted (3 signals)", "file": "s.json"}
    batches = [[_item(True), _item(False)], [_item(None, reasons=["too few"]), _item(True, site)]]
    assert _run(batches, caplog) == (
        "wrote 4 cases to out: the review flagged 2 and could not judge 1 (quality.csv); "
        "site monitor: ALARM, the site drifted (3 signals) after 4 cases (s.json)"
    )


def test_one_cause_for_every_unjudged_case_is_said(caplog):
    batches = [[_item(None, reasons=[NO_RANGE])]]
    assert _run(batches, caplog) == (
        f"wrote 1 case to out: the review flagged 0 and could not judge 1 (quality.csv), {NO_RANGE}"
    )


def test_without_case_quality_the_line_says_so(caplog):
    batches = [[{"segmentation": 0}], [{"segmentation": 1}]]
    assert _run(batches, caplog) == (
        "wrote 2 cases to out: no estimated DSC or review flag (the bundle's postprocessing has no CaseQualityd)"
    )


def test_a_second_run_counts_again(caplog):
    engine = Engine(lambda engine, batch: batch)
    InferenceSummary("out").attach(engine)
    with caplog.at_level(logging.INFO, logger="calib_monai"):
        engine.run([[_item(False)]], max_epochs=1)
        engine.run([[_item(True)], [_item(True)]], max_epochs=1)
    assert caplog.records[-1].getMessage().startswith("wrote 2 cases to out: the review flagged 2 and")
