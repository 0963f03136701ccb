"""Inference: backends that run the network, the one detection pipeline, tiling, image and video sources."""
