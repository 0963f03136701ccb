"""``ssd serve``: an HTTP detection service (FastAPI + uvicorn, the ``[serve]`` extra) with dynamic batching, a model
card, Prometheus metrics and a browser page. :mod:`ssd.client` is its client."""
