"""What a data set is: its classes, input channels and preprocessed volume size, stated once per component class."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["DatasetFacts"]


@dataclass(frozen=True)
class DatasetFacts:
    """The facts of a data set that the component, its bundles and their docs share (``Component.facts``), so that
    they cannot disagree with the component that reads the data.

    Args:
        label_names: class value (as a string, ``"0"`` .. ``"C-1"``) -> name, background first.
        channel_names: one name per input channel, in channel order.
        roi_size: the default preprocessed volume size ``(H, W, D)``; ``-1`` keeps an axis (the component's
            ``roi_size`` default and the bundles' ``roi_size``).
        regions: evaluation regions as unions of classes (BraTS ET/TC/WT), or None.
    """

    label_names: Mapping[str, str]
    channel_names: tuple[str, ...]
    roi_size: tuple[int, int, int]
    regions: Mapping[str, tuple[int, ...]] | None = field(default=None)

    def __post_init__(self) -> None:
        keys = list(self.label_names)
        if keys != [str(k) for k in range(len(keys))] or len(keys) < 2:
            raise ValueError(f"label_names must name the classes '0'..'C-1' in order (C >= 2), got keys {keys}")
        if not self.channel_names:
            raise ValueError("channel_names must name at least one input channel")
        if len(self.roi_size) != 3 or any(int(r) == 0 or int(r) < -1 for r in self.roi_size):
            raise ValueError(f"roi_size must be three positive sizes (or -1 to keep an axis), got {self.roi_size}")

    @property
    def num_classes(self) -> int:
        """Classes including background: the network's output channels."""
        return len(self.label_names)

    @property
    def in_channels(self) -> int:
        """Input channels of the network."""
        return len(self.channel_names)
