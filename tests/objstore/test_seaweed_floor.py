"""The test S3 server's free-disk floor: a nearly full disk is one clear error, not read-only volumes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline.testing import seaweed


def test_a_nearly_full_disk_is_a_clear_error_before_any_server_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if seaweed.weed_binary() is None:
        pytest.skip("SeaweedFS `weed` not installed")
    real = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(seaweed.shutil, "disk_usage", lambda _p: real._replace(free=seaweed.MIN_FREE))
    with pytest.raises(OSError, match=r"only 64 MiB free under .*; SeaweedFS needs 256 MiB"):
        seaweed.start_s3(tmp_path)
    assert not (tmp_path / "weed.log").exists()  # refused before any process was started
