"""The environment ``make test`` builds (issue 33, item 5): one OpenCV distribution, since every one of them
writes the same ``cv2`` folder and removing one breaks the others (the Makefile keeps one)."""

from importlib.metadata import distributions

CV2_DISTRIBUTIONS = {"opencv-python", "opencv-python-headless", "opencv-contrib-python",
                     "opencv-contrib-python-headless"}


def test_one_cv2_distribution_is_installed():
    installed = sorted({(d.metadata["Name"] or "").lower() for d in distributions()} & CV2_DISTRIBUTIONS)
    assert len(installed) <= 1, (f"{len(installed)} OpenCV distributions share the cv2 folder: {installed}; "
                                 "`make install` keeps one (opencv-contrib-python-headless)")
