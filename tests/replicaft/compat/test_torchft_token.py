"""The torchft shim's manager servers and clients take the job's token as the manager does
(replicaft/compat/torchft/coordination.py): an empty ``REPLICAFT_TOKEN`` is refused with the
manager's own message, not replaced by a secret of this process alone."""

from __future__ import annotations

import datetime

import pytest

from replicaft.compat.torchft.coordination import ManagerClient
from replicaft.config.options import ManagerOptions
from replicaft.errors import OptionsError


def test_an_empty_token_is_refused_with_the_managers_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLICAFT_TOKEN", "")
    with pytest.raises(OptionsError) as manager:
        ManagerOptions.from_env(lighthouse="127.0.0.1:1", replica_id="g0")
    with pytest.raises(OptionsError) as shim:
        ManagerClient("127.0.0.1:1", datetime.timedelta(seconds=1))
    assert str(shim.value) == str(manager.value)
    assert "REPLICAFT_TOKEN is set but empty" in str(shim.value)
