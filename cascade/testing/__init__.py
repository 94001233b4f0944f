"""Test helpers shipped with the package (the tier contract suite)."""
