"""The stage command on input that is not there: one error line naming it, exit 1, and
nothing staged."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.stage import main


def test_a_missing_data_root_is_an_error_naming_it_not_an_empty_staging(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-root"
    out = tmp_path / "staging"
    status = main(["--data-root", str(missing), "--out", str(out),
                   "--summary", str(tmp_path / "staging.json")])  # fmt: skip
    error = capsys.readouterr().err
    assert status == 1, error
    assert f"error: {missing}: no such directory" in error and "Traceback" not in error
    assert not out.exists() and not (tmp_path / "staging.json").exists()
