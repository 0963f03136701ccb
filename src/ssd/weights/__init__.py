"""Weights files: what a file is (identify), checkpoints of this library (checkpoint), which file a run directory
gives (resolve) and pretrained weights by name (hub). Turning a file into a model is :mod:`ssd.models`'s (load,
importers, foreign, finetune)."""
