"""Missed and poorly localized objects traced back to their size and default-box coverage."""

import torch

from ssd.evaluation.diagnosis import error_sources
from ssd.evaluation.tide import error_breakdown


def test_small_uncovered_missed_objects_get_a_next_step():
    """Image 200x200: a 10x10 object (relative size 0.05, 'small') and a 100x100 one (0.5, 'large'), both missed;
    one default box covering the large one exactly: half the missed objects small, half uncovered."""
    truths = [{"boxes": torch.tensor([[0.0, 0, 10, 10], [100, 100, 200, 200]]), "labels": torch.tensor([0, 0]),
               "difficult": torch.tensor([False, False]), "image_size": (200, 200)}]
    detections = [{"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64), "scores": torch.zeros(0)}]
    breakdown = error_breakdown(detections, truths, 1)
    priors = torch.tensor([[0.75, 0.75, 0.5, 0.5]])
    result = error_sources(truths, breakdown, priors)
    missed = result["missed"]
    assert missed["count"] == 2 and missed["uncovered"] == 0.5
    assert [(b["name"], b["count"]) for b in missed["by_size"]] == [("small", 1), ("medium", 0), ("large", 1)]
    assert missed["advice"] == ("50% of missed objects are small (under 10% of the image side) and 50% have no "
                                "default box at IoU 0.5: try `ssd check DATA --model MODEL --fit-priors`, a larger "
                                "`--image-size` or `--tile`")
    assert result["localization"] == {"count": 0, "by_size": [{"name": "small", "count": 0, "share": 0.0},
                                                              {"name": "medium", "count": 0, "share": 0.0},
                                                              {"name": "large", "count": 0, "share": 0.0}],
                                      "uncovered": 0.0, "advice": None}


def test_without_priors_only_sizes_are_reported():
    truths = [{"boxes": torch.tensor([[0.0, 0, 100, 100]]), "labels": torch.tensor([0]),
               "difficult": torch.tensor([False]), "image_size": (200, 200)}]
    detections = [{"boxes": torch.tensor([[0.0, 0, 100, 30]]), "labels": torch.tensor([0]),
                   "scores": torch.tensor([0.9])}]
    result = error_sources(truths, error_breakdown(detections, truths, 1))
    assert result["localization"]["count"] == 1 and result["localization"]["uncovered"] is None
    assert result["localization"]["by_size"][2] == {"name": "large", "count": 1, "share": 1.0}
    assert result["localization"]["advice"] is None and result["missed"]["count"] == 0


def test_the_next_step_names_the_dataset_and_the_model_where_known():
    truths = [{"boxes": torch.tensor([[0.0, 0, 10, 10]]), "labels": torch.tensor([0]),
               "difficult": torch.tensor([False]), "image_size": (200, 200)}]
    detections = [{"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64), "scores": torch.zeros(0)}]
    result = error_sources(truths, error_breakdown(detections, truths, 1), data="my data/data.yaml", model="ssd_tiny")
    assert result["missed"]["advice"] == ("100% of missed objects are small (under 10% of the image side): try "
                                          "`ssd check 'my data/data.yaml' --model ssd_tiny --fit-priors`, a larger "
                                          "`--image-size` or `--tile`")
