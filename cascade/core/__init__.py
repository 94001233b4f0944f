"""The layers of a :class:`~cascade.store.CascadeStore` (see docs/architecture.md):
the read and write paths, the tier chain, the block index, the resource guards, the
worker pools, warm-restart recovery and the tier factory."""
