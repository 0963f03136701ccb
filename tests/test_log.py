"""The one channel for messages (ssd.log): quiet as a library, rank 0 only under torchrun, no bars with --quiet."""

import logging
import subprocess
import sys

import pytest

from ssd.cli import main
from ssd.log import LOGGER, progress, progress_enabled, quiet_other_ranks, set_progress


@pytest.fixture
def restored():
    filters = list(LOGGER.filters)
    yield
    LOGGER.filters[:] = filters
    set_progress(True)


def test_library_use_prints_nothing_unless_logging_is_configured():
    code = "import ssd.log; ssd.log.LOGGER.warning('library warning'); ssd.log.LOGGER.info('library info')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert (done.stdout, done.stderr) == ("", "")  # Python's last-resort handler would print the warning


def test_ranks_other_than_zero_log_nothing_and_show_no_bars(restored, ssd_messages):
    quiet_other_ranks(0)
    LOGGER.info("from rank 0")
    assert ssd_messages() == ["from rank 0"] and progress_enabled()
    quiet_other_ranks(1)
    quiet_other_ranks(1)  # installed once
    LOGGER.info("from rank 1")
    assert ssd_messages() == ["from rank 0"] and len(LOGGER.filters) == 1
    assert progress(range(3)).disable and progress(range(3), disable=None).disable


def test_progress_bars_follow_set_progress_and_tqdms_terminal_rule(restored):
    assert not progress(range(3)).disable and progress(range(3), disable=True).disable
    set_progress(False)
    assert progress(range(3)).disable and progress(range(3), disable=None).disable


def test_quiet_turns_the_bars_off_for_the_command_and_back_on_after(restored, monkeypatch):
    seen = []
    monkeypatch.setattr("ssd.cli.COMMANDS", {"weights": lambda args: seen.append(progress_enabled()) or 0})
    assert main(["weights", "--quiet"]) == 0 and main(["weights"]) == 0
    assert seen == [False, True] and progress_enabled()
    assert logging.getLogger("ssd").handlers == LOGGER.handlers  # the command's stderr handler is removed after it
