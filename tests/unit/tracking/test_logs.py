"""setup_logging: one file per worker, console for the controller, idempotent."""

from __future__ import annotations

import logging

import pytest

from ascent.tracking import setup_logging, worker_log_path


@pytest.fixture
def clean_package_logger():
    package = logging.getLogger("ascent")
    saved = list(package.handlers), package.level
    yield
    for handler in package.handlers[:]:
        if handler not in saved[0]:
            package.removeHandler(handler)
            handler.close()
    package.setLevel(saved[1])


def test_worker_logs_go_to_its_file(tmp_path, clean_package_logger):
    logger = setup_logging(tmp_path, "rollout_0")
    logging.getLogger("ascent.rollout.engine").info("generated %d", 8)
    logger.debug("hidden at INFO")
    text = worker_log_path(tmp_path, "rollout_0").read_text()
    assert "generated 8" in text and "[rollout_0]" in text and "hidden" not in text
    assert logger.name == "ascent.rollout_0"


def test_setup_logging_is_idempotent(tmp_path, clean_package_logger):
    package = logging.getLogger("ascent")
    before = len(package.handlers)
    setup_logging(tmp_path, "controller", "DEBUG")
    setup_logging(tmp_path, "controller", "DEBUG")
    assert len(package.handlers) == before + 2  # one file, one console
    logging.getLogger("ascent.x").debug("once")
    assert (tmp_path / "logs" / "controller.log").read_text().count("once") == 1


@pytest.mark.parametrize(
    ("level", "shown"), [("debug", {"d", "i", "w"}), ("warning", {"w"}), ("error", set())]
)
def test_log_level_setting_filters_the_file(tmp_path, clean_package_logger, level, shown):
    """`tracking.log_level` values are lower-case names; each level shows itself and above."""
    setup_logging(tmp_path, "trainer_0", level)
    log = logging.getLogger("ascent.trainer")
    log.debug("msg-d")
    log.info("msg-i")
    log.warning("msg-w")
    text = worker_log_path(tmp_path, "trainer_0").read_text()
    assert {name for name in ("d", "i", "w") if f"msg-{name}" in text} == shown


def test_file_only_records_skip_the_console(tmp_path, clean_package_logger, capsys):
    from ascent.tracking.logs import FILE_ONLY

    setup_logging(tmp_path, "controller")
    logging.getLogger("ascent.x").info("progress line", extra=FILE_ONLY)
    logging.getLogger("ascent.x").info("ordinary line")
    err = capsys.readouterr().err
    assert "ordinary line" in err and "progress line" not in err
    assert "progress line" in (tmp_path / "logs" / "controller.log").read_text()
