"""Review a calib_monai prediction in 3D Slicer: image, segmentation (with its "low confidence" segment) and the
confidence as a colour overlay.

The segmentation and confidence files come from ``calib_monai.export.write_slicer_files`` (``<case>.seg.nrrd`` and
``<case>_confidence.nrrd``); the image is the input the bundle segmented (NIfTI, NRRD, ...).

From a shell (Slicer's own Python runs the script)::

    Slicer --python-script scripts/slicer_review.py --image IMG.nii.gz \
        --segmentation CASE.seg.nrrd --confidence CASE_confidence.nrrd

From Slicer's Python console::

    import sys; sys.path.append("/path/to/calib_monai/scripts")
    import slicer_review
    slicer_review.main(["--image", "IMG.nii.gz", "--segmentation", "CASE.seg.nrrd",
                        "--confidence", "CASE_confidence.nrrd"])

The slice views show the image, the confidence over it (blue = low, red = high, with ``--opacity``) and the segments;
the "low confidence" segment is drawn as an outline over the organs. ``--only-low-confidence`` hides the overlay where
the confidence is at or above the segment's threshold. This file imports ``slicer`` only inside ``main`` so that it can
be imported (and tested) without Slicer; it needs nothing but Slicer (no calib_monai, no pynrrd).
"""

from __future__ import annotations

import argparse
import sys

# Must match calib_monai.export.slicer.LOW_CONFIDENCE_SEGMENT_NAME (checked by tests/test_slicer_files.py).
LOW_CONFIDENCE_SEGMENT_NAME = "low confidence"
THRESHOLD_TAG = "calib_monai.confidence_threshold"
# Colour tables shipped with Slicer, first available wins: low confidence blue, high confidence red.
CONFIDENCE_COLOR_NODE_IDS = ("vtkMRMLColorTableNodeFileColdToHotRainbow.txt", "vtkMRMLColorTableNodeRainbow")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--image", required=True, help="the image that was segmented")
    parser.add_argument("--segmentation", required=True, help="<case>.seg.nrrd")
    parser.add_argument("--confidence", required=True, help="<case>_confidence.nrrd")
    parser.add_argument("--opacity", type=float, default=0.4, help="opacity of the confidence overlay (default 0.4)")
    parser.add_argument(
        "--confidence-min",
        type=float,
        default=0.0,
        help="confidence shown as the coldest colour (default 0; 1/number of classes is the floor)",
    )
    parser.add_argument(
        "--only-low-confidence", action="store_true", help="show the overlay only below the low-confidence threshold"
    )
    parser.add_argument(
        "--low-confidence-fill",
        type=float,
        default=0.0,
        help="2D fill opacity of the low-confidence segment (default 0: outline only)",
    )
    parser.add_argument("--show-3d", action="store_true", help="also build and show the segments' surfaces in 3D")
    return parser.parse_args(argv)


def _confidence_color_node_id(slicer) -> str | None:
    for node_id in CONFIDENCE_COLOR_NODE_IDS:
        if slicer.mrmlScene.GetNodeByID(node_id) is not None:
            return node_id
    return None


def _threshold_tag(segment) -> float | None:
    """The low-confidence threshold stored in the segment's tags by write_slicer_files (None if absent)."""
    import vtk

    value = vtk.reference("") if hasattr(vtk, "reference") else vtk.mutable("")  # std::string& out-argument
    if not segment.GetTag(THRESHOLD_TAG, value):
        return None
    try:
        return float(value.get())
    except ValueError:
        return None


def main(argv: list[str] | None = None):
    """Load the three files into the running Slicer and set up the views; returns (image, segmentation, confidence)
    nodes."""
    args = parse_args(argv)
    import slicer  # only inside Slicer

    image = slicer.util.loadVolume(args.image, {"singleFile": True})
    segmentation = slicer.util.loadSegmentation(args.segmentation)
    confidence = slicer.util.loadVolume(args.confidence, {"singleFile": True, "show": False})
    segmentation.SetReferenceImageGeometryParameterFromVolumeNode(image)  # edits happen on the image grid

    # Low-confidence segment: visible, outlined above the organs; its threshold is in the segment's tags.
    seg = segmentation.GetSegmentation()
    low_id = seg.GetSegmentIdBySegmentName(LOW_CONFIDENCE_SEGMENT_NAME)
    threshold = None
    display = segmentation.GetDisplayNode()
    if display is None:
        segmentation.CreateDefaultDisplayNodes()
        display = segmentation.GetDisplayNode()
    display.SetVisibility(True)
    if low_id:
        display.SetSegmentVisibility(low_id, True)
        display.SetSegmentOpacity2DFill(low_id, args.low_confidence_fill)
        display.SetSegmentOpacity2DOutline(low_id, 1.0)
        display.SetSegmentOpacity3D(low_id, 0.3)
        threshold = _threshold_tag(seg.GetSegment(low_id))
    else:
        print(f"slicer_review: no segment named {LOW_CONFIDENCE_SEGMENT_NAME!r} in {args.segmentation}")

    # Confidence: colour table, fixed [min, 1] window, optionally only where it is low.
    confidence.CreateDefaultDisplayNodes()
    conf_display = confidence.GetDisplayNode()
    color_node_id = _confidence_color_node_id(slicer)
    if color_node_id:
        conf_display.SetAndObserveColorNodeID(color_node_id)
    conf_display.AutoWindowLevelOff()
    conf_display.SetWindowLevelMinMax(args.confidence_min, 1.0)
    if args.only_low_confidence and threshold is not None:
        conf_display.AutoThresholdOff()
        conf_display.SetThreshold(-1.0, threshold)  # voxels outside are transparent
        conf_display.ApplyThresholdOn()
    conf_display.SetInterpolate(False)

    slicer.util.setSliceViewerLayers(
        background=image, foreground=confidence, foregroundOpacity=args.opacity, label=None, fit=True
    )
    if args.show_3d:
        segmentation.CreateClosedSurfaceRepresentation()
        slicer.app.layoutManager().setLayout(slicer.vtkMRMLLayoutNode.SlicerLayoutFourUpView)
        slicer.app.layoutManager().threeDWidget(0).threeDView().resetFocalPoint()

    names = [seg.GetNthSegment(i).GetName() for i in range(seg.GetNumberOfSegments())]
    print(f"slicer_review: {len(names)} segments ({', '.join(names)}); low-confidence threshold: {threshold}")
    return image, segmentation, confidence


if __name__ == "__main__":
    main(sys.argv[1:])
