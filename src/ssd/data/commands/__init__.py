"""Dataset commands (``ssd data convert | split | merge | browse``): writing records in a format, splitting,
merging and showing a dataset. Datasets are read with :func:`ssd.data.load.load_dataset`, so every reader works."""
