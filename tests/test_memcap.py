import sys

import pytest

from swapmoe.errors import SwapmoeError
from swapmoe.memcap import available_memory, own_cgroup, run_capped


def test_available_memory_is_positive():
    n, source = available_memory()
    assert n > 0 and source


def _capped(code: str, mib: int):
    try:
        return run_capped([sys.executable, "-c", code], mib << 20)
    except SwapmoeError as e:  # not root / no cgroup: nothing to test on this machine
        pytest.skip(str(e))


@pytest.mark.skipif(own_cgroup() is None, reason="no memory cgroup")
def test_cap_counts_and_kills():
    ok = _capped("import numpy as np; a = np.ones(40_000_000 // 8); print(a.sum())", 300)
    assert ok.returncode == 0 and ok.oom_kills == 0 and 0 < ok.peak <= 300 << 20
    over = _capped("import numpy as np; a = np.ones(600_000_000 // 8); print(a.sum())", 300)
    assert over.returncode != 0 and over.oom_kills >= 1
