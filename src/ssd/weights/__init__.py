"""Weights files: checkpoints of this library (checkpoint), what a file is (identify), which file a run directory
gives (resolve), models rebuilt from them (load), foreign detectors imported (importers, foreign) and fine-tuning
to other classes (finetune)."""
