"""``r3store validate|stats|diff URL --ray [ADDRESS]``: the same output as the local scan.

Stores with injected faults (``r3store.testing.faults``: a corrupted frame, an all-zero
layer, repeated and out-of-range ids, a row-count fault, a duplicate id, quarantined
samples, an uncommitted leftover), on local disk and on loopback S3; outputs compared
byte for byte, ``--json`` and tables, exit status included; one run connects to the
cluster by its address from another process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

import r3store
from r3store.audit import validate
from r3store.errors import ChecksumError
from r3store.testing.faults import FaultyStore, write_faulty_store
from tests.clirun import run_cli as run

ray = pytest.importorskip("ray")
import r3store.ray as r3ray  # noqa: E402 - after the importorskip

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> FaultyStore:
    return write_faulty_store(tmp_path_factory.mktemp("ray-audit") / "faulty", clean_samples=24)


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> FaultyStore:
    return write_faulty_store(tmp_path_factory.mktemp("ray-audit") / "other", seed=1, corrupt=False,
                              clean_samples=24)



def same(*args: str) -> Result:
    """Run the command locally and with --ray; both must print the same and exit the same."""
    here = run(*args)
    there = run(*args, "--ray")
    assert (there.exit_code, there.stdout, there.stderr) == (here.exit_code, here.stdout, here.stderr)
    return here


def test_validate_on_ray_equals_local(ray_cluster: str, faulty: FaultyStore) -> None:
    doc = json.loads(same("validate", faulty.url, "--json").stdout)
    assert set(doc["summary"]["by_kind"]) == {"checksum", "zero_layer", "repeated_ids", "id_out_of_range",
                                              "row_count", "duplicate_sample", "quarantined", "uncommitted"}
    assert doc["summary"]["arrays_checked"] == len(faulty.commits)
    assert same("validate", faulty.url).exit_code == 1  # the table too
    assert same("validate", faulty.url, "--json", "--sample-filter", "w1-*", "--limit", "3").exit_code == 1
    assert same("validate", faulty.url, "--json", "--workers", "2").exit_code == 1


def test_stats_and_diff_on_ray_equal_local(ray_cluster: str, faulty: FaultyStore, other: FaultyStore) -> None:
    doc = json.loads(same("stats", other.url, "--json", "--top", "5").stdout)
    assert doc["samples"] == len(r3store.open_store(other.url, on_duplicate="first"))
    same("stats", other.url)
    doc = json.loads(same("diff", faulty.url, other.url, "--json", "--sample-filter", "w[02]-*").stdout)
    assert doc["samples_compared"] > 10
    assert doc["decision_flip_rate"] > 0.5
    # a scan that hits the corrupted frame fails the same way: exit 2, the same one-line error
    failed = same("stats", faulty.url)
    assert failed.exit_code == 2
    assert "ChecksumError" in failed.stderr


def test_the_ray_path_runs_no_local_scan(ray_cluster: str, faulty: FaultyStore,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """With the single-process runner broken, --ray still answers (and the local scan does not)."""
    import r3store.audit._validate as validate_module

    def broken(*args: object, **kwargs: object) -> None:
        raise AssertionError("the local scan ran")

    monkeypatch.setattr(validate_module, "run_plan", broken)
    assert json.loads(run("validate", faulty.url, "--json", "--ray").stdout)["summary"]["by_kind"]["checksum"] == 1
    with pytest.raises(AssertionError, match="the local scan ran"):
        run("validate", faulty.url, "--json")


def test_ray_errors_are_r3store_errors(ray_cluster: str, faulty: FaultyStore) -> None:
    with pytest.raises(ChecksumError, match=r"chunk \(0, 0, 0\)"):
        r3ray.stats(faulty.url, num_tasks=3)


def test_progress_is_counted_in_tasks(ray_cluster: str, faulty: FaultyStore) -> None:
    seen: list[tuple[int, int]] = []
    report = r3ray.validate(faulty.url, num_tasks=3, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert report == validate(r3store.open_reader(faulty.url, on_duplicate="report"))
    one = r3ray.validate(faulty.url, num_tasks=1)
    assert one.to_dict() == report.to_dict()


def test_ray_address_from_another_process(ray_cluster: str, faulty: FaultyStore) -> None:
    """``--ray ADDRESS`` in a new process joins the running cluster (its GCS address)."""
    local = run("validate", faulty.url, "--json")
    proc = subprocess.run([sys.executable, "-m", "r3store.cli", "validate", faulty.url, "--json", "--ray", ray_cluster],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout) == json.loads(local.stdout)


@pytest.mark.s3
def test_validate_on_ray_on_loopback_s3(ray_cluster: str, s3_bucket: str, s3_storage_options: dict[str, Any]) -> None:
    url = f"s3://{s3_bucket}/{uuid.uuid4().hex}/faulty"
    write_faulty_store(url, storage_options=s3_storage_options)
    opts = s3_storage_options
    flags = ["-o", f"key={opts['key']}", "-o", f"secret={opts['secret']}",
             "-o", f"endpoint_url={opts['client_kwargs']['endpoint_url']}",
             "-o", f"region_name={opts['client_kwargs']['region_name']}"]
    doc = json.loads(same("validate", url, "--json", *flags).stdout)
    assert doc["summary"]["by_kind"]["checksum"] == 1
    assert doc["summary"]["by_kind"]["uncommitted"] == 1


def test_without_ray_the_option_says_what_to_install(faulty: FaultyStore) -> None:
    code = ("import sys; sys.modules['ray'] = None\n"
            "from r3store.cli import main\n"
            f"main(['validate', {faulty.url!r}, '--ray'])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          check=False)
    assert proc.returncode == 2
    assert "pip install 'r3store[ray]'" in proc.stderr
