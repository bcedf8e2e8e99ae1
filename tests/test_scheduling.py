"""The suite's schedule holds: tests/conftest.py groups the code preset's tests onto one worker with xdist_group
marks added at collection, and a pytest that xdist cannot tag drops those groups in silence (pytest 9.2 with
xdist 3.8, pytest-xdist issue 1386: both workers then wait on the same build, a minute of the suite's time)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

CONFTEST = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        if "shared" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("shared"))

@pytest.fixture
def shared():
    return 1
"""

TESTS = "".join(f"def test_{n}(shared):\n    pass\n\n" for n in range(4)) + "def test_alone():\n    pass\n"


def test_groups_added_at_collection_reach_xdist(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_grouped.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS"))}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup", "-p",
                           "no:cacheprovider", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:]
    workers = {line.split()[0] for line in proc.stdout.splitlines() if "PASSED" in line and "@shared" in line}
    assert len(workers) == 1, proc.stdout[-2000:]  # every grouped test, tagged, on one worker
    assert proc.stdout.count("@shared") >= 4, proc.stdout[-2000:]
