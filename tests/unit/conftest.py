"""Fixtures shared by the unit tests of several packages."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_cluster():
    """A local 2-CPU Ray cluster for the module's tests (joined if this process already runs one)."""
    ray = pytest.importorskip("ray")
    from ascent.cluster.ray_backend import init_ray

    started_here = not ray.is_initialized()
    init_ray(num_cpus=2, log_to_driver=False)
    yield
    if started_here:
        ray.shutdown()


@pytest.fixture(scope="session")
def vl_processor_dir(tmp_path_factory):
    """A vision-language checkpoint's tokenizer, image processor and config.json, without weights
    (`tests/unit/vl_files.py`)."""
    from tests.unit.vl_files import make_vl_processor_dir

    return make_vl_processor_dir(tmp_path_factory.mktemp("vl_processor"))
