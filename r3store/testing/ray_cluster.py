"""A local Ray cluster for tests, started once per test session (a pytest plugin).

Usage (``tests/conftest.py``)::

    pytest_plugins = ["r3store.testing.ray_cluster"]

    @pytest.mark.ray
    def test_something(ray_cluster):
        ds = r3store.ray.read_routes(url)

Fixtures
--------
ray_cluster
    Session-scoped: ``ray.init(num_cpus=2, include_dashboard=False)`` (2 workers, worker
    output not forwarded, Ray Data progress bars off); yields the cluster's GCS address
    (``host:port``) that another process can pass to ``ray.init(address=...)``;
    ``ray.shutdown()`` at the end of the session. ray is imported only when the fixture
    runs, so the plugin costs nothing to sessions without Ray tests.

Test modules whose tasks or actors are defined in the module itself should call
:func:`pickle_by_value` on it: test modules are not importable by Ray's workers.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator

import pytest

__all__ = ["NUM_CPUS", "pickle_by_value", "ray_cluster"]

NUM_CPUS = 2


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=NUM_CPUS, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray.get_runtime_context().gcs_address
    if started:
        ray.shutdown()


def pickle_by_value(module_name: str) -> None:
    """Make Ray ship the classes and functions of ``module_name`` (a test module) by value."""
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[module_name])  # type: ignore[no-untyped-call]
