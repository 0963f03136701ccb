"""Training, evaluation, inference, export and plots (import the submodules: ``ssd.engine.metrics``, ``.evaluation``,
``.plots``, ``.trainer``, ...; nothing is imported here so that ``import ssd`` stays light)."""
