"""Test helpers shipped with the package: the tier contract suite, and device-buffer
stand-ins that exercise the device code paths without a GPU (device_buffers)."""
