"""Weights files: checkpoints of this library, recognising foreign files, importing and fine-tuning them."""
