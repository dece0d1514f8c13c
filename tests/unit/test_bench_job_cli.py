"""``compass bench job --view``: the worker's view, checked before any worker starts."""

from __future__ import annotations

import pytest

from compass._bench import job
from compass._cli.main import main
from compass.errors import ConfigError


def test_an_unknown_view_is_one_line_and_starts_no_worker(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["bench", "job", "--jobs", "1", "--view", "full"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "--view must be one of bounded, mesh, got 'full'" in err and len(err.splitlines()) == 1
    with pytest.raises(ConfigError, match="--view must be one of"):
        job.run(jobs=1, view="full")
