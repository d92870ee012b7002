"""Shared test set-up: tests may reconfigure the engine's logger (the CLI and tools call
setup_logging); restore it after each test so that caplog-based tests see records whatever the
order."""
import pytest

from caffe_engine.log import logger


@pytest.fixture(autouse=True)
def _restore_engine_logger():
    handlers, level, propagate = logger.handlers[:], logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate
