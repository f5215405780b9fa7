"""The warm standby: its activation message as a table, then real standby processes that must run
a script exactly as ``python SCRIPT ARGS`` would. The launcher's use of it is in test_launch.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from replicaft.process import standby
from replicaft.process.standby import (
    READY_LINE,
    RESERVED_LINE,
    Activation,
    Reserve,
    decode_message,
    encode_activation,
    encode_reserve,
    reserve_bytes_for,
    reserve_refusal,
)

SCRIPT = """\
import json, os, sys
import helper
print(json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0], "helper": helper.VALUE,
                  "id": os.environ.get("REPLICAFT_REPLICA_ID"), "stdin": sys.stdin.read(),
                  "file": __file__}))
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
"""


def test_activation_round_trips() -> None:
    env = {"REPLICAFT_REPLICA_ID": "g1", "REPLICAFT_EVENTS_DIR": "/tmp/a b", "EMPTY": ""}
    line = encode_activation(env)
    assert line.endswith("\n") and line.count("\n") == 1
    assert decode_message(line) == Activation(env)


def test_reserve_round_trips_and_is_sized_by_the_state() -> None:
    line = encode_reserve(123456)
    assert line.endswith("\n") and line.count("\n") == 1
    assert decode_message(line) == Reserve(123456)
    assert reserve_bytes_for(0) == 0
    state = 1_610_612_736  # a 500 MB model's with AdamW
    assert state + state // 32 < reserve_bytes_for(state) <= state + state // 32 + (2 << 20)
    assert reserve_bytes_for(20_000) > 20_000 + (1 << 20) - 1  # a small state still gets room for padding


GIB = 1 << 30


def _meminfo(total: int, available: int) -> str:
    return f"MemTotal:       {total // 1024} kB\nMemFree:        1 kB\nMemAvailable:   {available // 1024} kB\n"


def test_a_reserve_leaves_a_tenth_of_memory_and_at_least_a_gib_available() -> None:
    assert reserve_refusal(10 * GIB, _meminfo(24 * GIB, 20 * GIB)) is None
    assert reserve_refusal(18 * GIB, _meminfo(24 * GIB, 20 * GIB)) is not None  # 2.4 GiB kept free
    assert reserve_refusal(17 * GIB, _meminfo(24 * GIB, 20 * GIB)) is None
    assert reserve_refusal(3 * GIB, _meminfo(8 * GIB, 4 * GIB)) is None
    why = reserve_refusal(3 * GIB + 1, _meminfo(8 * GIB, 4 * GIB))  # 1 GiB kept free on a small machine
    assert why == (
        f"only {4 * GIB} bytes of memory are available, and {GIB} of them are kept free for the training processes"
    )


def test_without_meminfo_the_kernel_decides() -> None:
    assert reserve_refusal(1 << 60, "") is None
    assert reserve_refusal(1 << 60, "MemTotal: 1 kB\n") is None


@pytest.mark.parametrize(
    ("line", "message_part"),
    [
        ("not json\n", "the standby's message is not JSON"),
        ("[1, 2]\n", "exactly the key 'env' (an activation) or 'reserve_bytes'"),
        ('{"env": {}, "extra": 1}\n', "exactly the key 'env'"),
        ('{"env": {}, "reserve_bytes": 1}\n', "exactly the key 'env'"),
        ('{"reserve_bytes": 0}\n', "'reserve_bytes' must be a positive integer, got 0"),
        ('{"reserve_bytes": -5}\n', "'reserve_bytes' must be a positive integer, got -5"),
        ('{"reserve_bytes": "1GB"}\n', "'reserve_bytes' must be a positive integer, got '1GB'"),
        ('{"reserve_bytes": true}\n', "'reserve_bytes' must be a positive integer, got True"),
        ('{"reserve_bytes": 1.5}\n', "'reserve_bytes' must be a positive integer, got 1.5"),
        ('{"env": ["A=1"]}\n', "must map names to strings"),
        ('{"env": {"A": 1}}\n', "must map names to strings"),
        ('{"env": {"A=B": "1"}}\n', "invalid environment variables: ['A=B']"),
        ('{"env": {"": "1"}}\n', "invalid environment variables: ['']"),
        ('{"env": {"A": "x\\u0000y"}}\n', "invalid environment variables: ['A']"),
    ],
)
def test_malformed_messages_are_refused_saying_what(line: str, message_part: str) -> None:
    with pytest.raises(ValueError) as raised:
        decode_message(line)
    assert message_part in str(raised.value)


def _script_dir(tmp_path: Path) -> Path:
    """A script beside a module it imports: found only if the script's directory leads sys.path."""
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "helper.py").write_text("VALUE = 42\n")
    return tmp_path / "train.py"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLICAFT_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return {**env, **extra}


class Standby:
    """``python -m replicaft.process.standby SCRIPT --steps 3`` started with its whole stdin already
    written and closed, as ``subprocess.run(input=...)`` would give it (``stdin=None``: left
    open, so the standby stays idle); ``result()`` waits for its exit."""

    def __init__(self, script: Path, stdin: str | None, **env: str) -> None:
        self.script = script
        self.args = [sys.executable, "-m", "replicaft.process.standby", str(script), "--steps", "3"]
        self.popen = subprocess.Popen(
            self.args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(**env),
            cwd=REPO_ROOT,
        )
        assert self.popen.stdin is not None
        if stdin is not None:
            self.popen.stdin.write(stdin)  # a few lines: the pipe holds them until the standby reads
            self.popen.stdin.close()

    def result(self) -> subprocess.CompletedProcess[str]:
        assert self.popen.stdout is not None and self.popen.stderr is not None
        self.popen.wait(timeout=120)
        return subprocess.CompletedProcess(
            self.args, self.popen.returncode, self.popen.stdout.read(), self.popen.stderr.read()
        )


RESERVE_SCRIPT = """\
import json, torch
from replicaft.process import reserve
held = reserve.installed()
bucket = reserve.empty(1000, torch.float32)
start = held._bytes.data_ptr()
print(json.dumps({"num_bytes": held.num_bytes, "used": held.used_bytes,
                  "inside": start <= bucket.data_ptr() < start + held.num_bytes,
                  "oom_score_adj": open("/proc/self/oom_score_adj").read().strip()}))
"""


def _script(tmp_path_factory: pytest.TempPathFactory, name: str, text: str | None = None) -> Path:
    """A fresh folder holding train.py (``text``, or SCRIPT beside the module it imports)."""
    if text is None:
        return _script_dir(tmp_path_factory.mktemp(name))
    script = tmp_path_factory.mktemp(name) / "train.py"
    script.write_text(text)
    return script


@pytest.fixture(scope="module")
def standbys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Standby]]:
    """Every standby process the tests below check, started at once: each spends ~3 s importing
    torch and replicaft and waits for nothing else, so on 2 cores they take half the time
    side by side that they took one after another. Each test reads its own standby's result."""
    runs = {
        "activated": Standby(
            _script(tmp_path_factory, "activated"),
            encode_activation({"REPLICAFT_REPLICA_ID": "g1"}) + "ignored: stdin is /dev/null\n",
        ),
        "exit_code": Standby(_script(tmp_path_factory, "exit_code"), encode_activation({"EXIT_CODE": "3"})),
        "launcher_gone": Standby(_script(tmp_path_factory, "launcher_gone"), ""),
        "malformed_activation": Standby(_script(tmp_path_factory, "malformed_activation"), '{"env": {"A": 1}}\n'),
        "reserves": Standby(
            _script(tmp_path_factory, "reserves", RESERVE_SCRIPT),
            encode_reserve(1 << 20) + encode_reserve(3 << 20) + encode_activation({}),
        ),
        "reserve_too_large": Standby(
            _script(tmp_path_factory, "reserve_too_large", "print('ran')\n"),
            encode_reserve(1 << 60) + encode_activation({}),
        ),  # an exabyte
        "malformed_reserve": Standby(
            _script(tmp_path_factory, "malformed_reserve"), '{"reserve_bytes": -1}\n' + encode_activation({})
        ),
        "idle": Standby(_script(tmp_path_factory, "idle"), None),
    }
    try:
        yield runs
    finally:
        for run in runs.values():
            if run.popen.poll() is None:
                run.popen.kill()
            run.popen.wait()


@pytest.mark.timeout(150)
def test_an_activated_standby_runs_the_script_as_python_would(standbys: dict[str, Standby]) -> None:
    script = standbys["activated"].script
    cold = subprocess.run(
        [sys.executable, str(script), "--steps", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(REPLICAFT_REPLICA_ID="g1"),
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
    )
    assert cold.returncode == 0, cold.stderr
    warm = standbys["activated"].result()
    assert warm.returncode == 0, warm.stderr
    ready, output = warm.stdout.splitlines()
    assert ready == f"{READY_LINE} {ready.rsplit(' ', 1)[1]}" and ready.rsplit(" ", 1)[1].isdigit()
    assert json.loads(output) == json.loads(cold.stdout)
    assert json.loads(output)["name"] == "__main__" and json.loads(output)["stdin"] == ""


@pytest.mark.timeout(150)
def test_the_script_exit_code_is_the_standby_exit_code(standbys: dict[str, Standby]) -> None:
    warm = standbys["exit_code"].result()
    assert warm.returncode == 3, warm.stderr


@pytest.mark.timeout(150)
def test_a_standby_whose_launcher_goes_away_exits_0_without_running_the_script(standbys: dict[str, Standby]) -> None:
    warm = standbys["launcher_gone"].result()
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout.startswith(READY_LINE) and len(warm.stdout.splitlines()) == 1


@pytest.mark.timeout(150)
def test_a_malformed_activation_ends_the_standby_with_a_message_and_runs_nothing(standbys: dict[str, Standby]) -> None:
    warm = standbys["malformed_activation"].result()
    assert warm.returncode == 2
    assert "replicaft.process.standby: the activation's 'env' must map names to strings" in warm.stderr
    assert len(warm.stdout.splitlines()) == 1


@pytest.mark.timeout(150)
def test_a_standby_faults_in_each_reserve_asked_for_and_the_script_allocates_from_the_last(
    standbys: dict[str, Standby],
) -> None:
    warm = standbys["reserves"].result()
    assert warm.returncode == 0, warm.stderr
    ready, first, second, output = warm.stdout.splitlines()
    pid = ready.rsplit(" ", 1)[1]
    assert first == f"{RESERVED_LINE} {1 << 20} bytes, pid {pid}"
    assert second == f"{RESERVED_LINE} {3 << 20} bytes, pid {pid}"
    own = Path("/proc/self/oom_score_adj").read_text().strip()  # the standby's parent's: a cold start's
    assert json.loads(output) == {"num_bytes": 3 << 20, "used": 4000, "inside": True, "oom_score_adj": own}


@pytest.mark.timeout(150)
def test_an_idle_standby_is_the_oom_killers_first_choice(standbys: dict[str, Standby]) -> None:
    process = standbys["idle"].popen
    try:
        assert process.stdout is not None and process.stdout.readline().startswith(READY_LINE)
        assert Path(f"/proc/{process.pid}/oom_score_adj").read_text().strip() == "1000"
    finally:
        process.communicate(timeout=60)  # EOF: it exits 0 without running the script
    assert process.returncode == 0


@pytest.mark.timeout(150)
def test_a_reserve_larger_than_the_machine_is_reported_and_the_standby_still_runs_the_script(
    standbys: dict[str, Standby],
) -> None:
    warm = standbys["reserve_too_large"].result()
    assert warm.returncode == 0, warm.stderr
    assert f"replicaft.process.standby: no reserve of {1 << 60} bytes: only " in warm.stderr
    assert warm.stdout.splitlines()[1:] == ["ran"]


@pytest.mark.timeout(150)
def test_a_malformed_reserve_ends_the_standby_with_a_message_and_runs_nothing(standbys: dict[str, Standby]) -> None:
    warm = standbys["malformed_reserve"].result()
    assert warm.returncode == 2
    assert "replicaft.process.standby: the reserve's 'reserve_bytes' must be a positive integer, got -1" in warm.stderr
    assert len(warm.stdout.splitlines()) == 1


def test_a_reserve_the_kernel_refuses_is_reported_and_the_wait_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from replicaft.process import reserve

    def refuse(num_bytes: int) -> None:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(reserve, "install", refuse)
    monkeypatch.setattr(standby, "reserve_refusal", lambda num_bytes, meminfo: None)
    read_end, write_end = os.pipe()
    os.write(write_end, (encode_reserve(4096) + encode_activation({"A": "1"})).encode())
    os.close(write_end)
    try:
        assert standby.wait_for_activation(read_end) == Activation({"A": "1"})
    finally:
        os.close(read_end)
    assert (
        "replicaft.process.standby: no reserve of 4096 bytes: [Errno 12] Cannot allocate memory"
        in capsys.readouterr().err
    )
