"""Dataset components that bundle configs name."""
