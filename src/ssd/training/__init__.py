"""Training: options, the loop, optimisation, run directories, resuming and the demo."""
