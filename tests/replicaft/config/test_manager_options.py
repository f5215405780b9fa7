"""ManagerOptions (replicaft/config/options.py): checked once when built; from_env in one place.

(tests/lighthouse/test_options.py covers the lighthouse's options.)
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT

from lighthouse import errors as lighthouse_errors
from lighthouse.config.options import LighthouseOptions
from replicaft.checkpoint.options import CheckpointOptions
from replicaft.config.env_names import READ_OUTSIDE_THE_LIBRARY
from replicaft.config.options import KNOWN_VARIABLES, ManagerOptions
from replicaft.errors import OptionsError

REQUIRED = {"lighthouse": "127.0.0.1:29510", "replica_id": "g0"}


def build(**fields: Any) -> ManagerOptions:
    return ManagerOptions(**{**REQUIRED, **fields})


def test_defaults_are_valid_single_rank_loopback() -> None:
    options = build()
    assert (options.group_rank, options.group_world_size, options.host) == (0, 1, "127.0.0.1")
    assert options.heartbeat_interval_s < options.collective_timeout_s < options.quorum_timeout_s
    assert options.heal_timeout_s < options.quorum_timeout_s


@pytest.mark.parametrize(
    ("fields", "names", "fix"),
    [
        pytest.param({"replica_id": ""}, "replica_id is empty", "e.g. 'g0'", id="empty_replica_id"),
        pytest.param(
            {"replica_id": "g" * 200},
            "replica_id is 200 characters long",
            "1-128 characters",
            id="replica_id_too_long_issue_19",
        ),
        pytest.param(
            {"replica_id": "g0\nFORGED"}, "replica_id is 'g0\\nFORGED'", "letters, digits", id="replica_id_newline"
        ),
        pytest.param(
            {"lighthouse": "localhost"}, "lighthouse='localhost'", "host:port (e.g. 127.0.0.1:29510)", id="no_port"
        ),
        pytest.param({"lighthouse": "localhost:"}, "lighthouse='localhost:'", "host:port", id="empty_port"),
        pytest.param({"lighthouse": ":29510"}, "lighthouse=':29510'", "host:port", id="empty_host"),
        pytest.param({"lighthouse": "host:http"}, "lighthouse='host:http'", "host:port", id="port_not_a_number"),
        pytest.param({"lighthouse": "host:70000"}, "lighthouse='host:70000'", "host:port", id="port_too_big"),
        pytest.param(
            {"group_rank": 2, "group_world_size": 2, "group_store": "h:1"},
            "group_rank=2 with group_world_size=2",
            "need 0 <= group_rank < group_world_size",
            id="rank_past_world",
        ),
        pytest.param({"group_rank": -1}, "group_rank=-1", "need 0 <= group_rank", id="negative_rank"),
        pytest.param(
            {"group_world_size": 0}, "group_world_size=0 is outside [1, 65536]", "ranks per group", id="empty_world"
        ),
        pytest.param(
            {"group_world_size": 2},
            "group_world_size=2 needs group_store",
            "MASTER_ADDR and MASTER_PORT",
            id="world_without_store",
        ),
        pytest.param(
            {"group_store": "store"}, "group_store='store'", "host:port (e.g. 127.0.0.1:29500)", id="store_without_port"
        ),
        pytest.param(
            {"backend": "mpi"}, "backend='mpi'", "use 'gloo', 'nccl', or leave it unset", id="unknown_backend"
        ),
        pytest.param({"min_replicas": 0}, "min_replicas=0", "at least 1", id="min_replicas_zero"),
        pytest.param(
            {"heartbeat_interval_s": 0.0},
            "heartbeat_interval_s=0.0 is outside [0.001, 86400]",
            "seconds",
            id="heartbeat_zero",
        ),
        pytest.param(
            {"connect_timeout_s": -1.0}, "connect_timeout_s=-1.0 is outside", "seconds", id="connect_negative"
        ),
        pytest.param({"heal_timeout_s": float("nan")}, "heal_timeout_s=nan is outside", "seconds", id="heal_nan"),
        pytest.param(
            {"quorum_timeout_s": 1e6},
            "quorum_timeout_s=1000000.0 is outside [0.001, 86400]",
            "seconds",
            id="quorum_timeout_past_a_day_issue_19",
        ),
        pytest.param(
            {"checkpoint_dir": "/ckpt", "checkpoint_interval_s": float("nan")},
            "checkpoint_interval_s=nan is outside",
            "0 disables the time trigger",
            id="checkpoint_interval_nan_issue_19",
        ),
        pytest.param(
            {"preemption_grace_s": float("nan")},
            "preemption_grace_s=nan is outside",
            "seconds",
            id="preemption_grace_nan",
        ),
        pytest.param(
            {"checkpoint_keep_last": -1},
            "checkpoint_keep_last=-1 is outside",
            "the newest is always kept",
            id="keep_last_negative_issue_19",
        ),
        pytest.param(
            {"checkpoint_object_store": "bucket/prefix", "checkpoint_dir": "/ckpt"},
            "checkpoint_object_store='bucket/prefix' is not s3://bucket/prefix",
            "3-63 characters",
            id="object_store_not_s3",
        ),
        pytest.param(
            {"checkpoint_tier2_dir": "/t2"},
            "tier2_directory='/t2' is set without a checkpoint directory",
            "set both",
            id="tier2_without_dir",
        ),
        pytest.param({"token": ""}, "token is empty", "pass a non-empty token or none at all", id="empty_token"),
        pytest.param(
            {"lighthouse": 29510}, "lighthouse=29510 is not a string", "give a string", id="lighthouse_not_str"
        ),
        pytest.param(
            {"events_dir": "/tmp/\x00x"},
            "events_dir='/tmp/\\x00x' is not a string without NUL bytes",
            "or leave it unset",
            id="nul_in_path",
        ),
        pytest.param({"deterministic": 1}, "deterministic=1", "give True or False", id="deterministic_not_bool"),
        pytest.param(
            {"collective_timeout_s": 0.05},
            "collective_timeout_s=0.05 is not above heartbeat_interval_s=0.1",
            "raise collective_timeout_s",
            id="collective_not_above_heartbeat",
        ),
        pytest.param(
            {"collective_timeout_s": 60.0},
            "quorum_timeout_s=60.0 is not above collective_timeout_s=60.0",
            "set quorum_timeout_s above 60.0",
            id="quorum_not_above_collective",
        ),
        pytest.param(
            {"heal_timeout_s": 90.0},
            "quorum_timeout_s=60.0 is not above heal_timeout_s=90.0",
            "set quorum_timeout_s above 90.0",
            id="quorum_not_above_heal",
        ),
        pytest.param({"max_quorum_failures": 0}, "max_quorum_failures=0", "at least 1", id="no_quorum_failures"),
        pytest.param({"heal_connections": 0}, "heal_connections=0", "at least 1", id="no_heal_connections"),
        pytest.param(
            {"digest_every_steps": -1}, "digest_every_steps=-1", "use 0 (off) or more", id="negative_digest_interval"
        ),
        pytest.param({"fault_points": "boom@1"}, "fault point 'boom@1'", "e.g. allreduce@5", id="bad_fault_point"),
        pytest.param(
            {"checkpoint_keep_best_k": 2},
            "keep_best_k=2 needs keep_best_metric",
            "keep_best_metric='loss'",
            id="keep_best_without_metric_issue_23",
        ),
        pytest.param(
            {"checkpoint_keep_best_metric": "loss"},
            "keep_best_metric='loss' is set but keep_best_k=0",
            "set keep_best_k >= 1",
            id="keep_best_metric_without_k_issue_23",
        ),
        pytest.param(
            {"checkpoint_keep_best_k": 1, "checkpoint_keep_best_metric": "loss", "checkpoint_keep_best_mode": "low"},
            "keep_best_mode='low'",
            "'min' (lower is better, a loss)",
            id="keep_best_mode_unknown_issue_23",
        ),
        pytest.param(
            {"checkpoint_milestone_at_epoch_end": "yes"},
            "checkpoint_milestone_at_epoch_end='yes'",
            "give True or False",
            id="epoch_end_not_bool_issue_23",
        ),
        pytest.param(
            {"resume_verify_action": "halt"},
            "resume_verify_action='halt'",
            "use 'warn'",
            id="resume_verify_action_unknown_issue_23",
        ),
        pytest.param(
            {"resume_verify_steps": 17},
            "resume_verify_steps=17 is outside [0, 16]",
            "e.g. 5",
            id="resume_verify_steps_past_the_trajectory_issue_23",
        ),
        pytest.param(
            {"checkpoint_keep_geometric_from": -4},
            "checkpoint_keep_geometric_from=-4 is outside",
            "use 0 for no geometric spacing",
            id="geometric_negative_issue_23",
        ),
    ],
)
def test_invalid_option_rejected_naming_the_field_and_the_fix(fields: dict[str, Any], names: str, fix: str) -> None:
    with pytest.raises(OptionsError) as raised:
        build(**fields)
    assert names in str(raised.value)
    assert fix in str(raised.value)


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"lighthouse": "[::1]:29510"}, id="ipv6_lighthouse"),
        pytest.param({"lighthouse": "lighthouse.internal:1"}, id="hostname_lighthouse"),
        pytest.param({"group_rank": 3, "group_world_size": 4, "group_store": "10.0.0.1:29500"}, id="last_rank"),
        pytest.param({"backend": "gloo", "digest_every_steps": 0, "fault_points": "heal@0,commit@3"}, id="chaos_run"),
        pytest.param(
            {"quorum_timeout_s": 5.0, "collective_timeout_s": 1.0, "heal_timeout_s": 4.0, "heartbeat_interval_s": 0.05},
            id="tight_timeouts",
        ),
    ],
)
def test_valid_options_accepted(fields: dict[str, Any]) -> None:
    assert build(**fields) is not None


def test_from_env_reads_every_replicaft_variable() -> None:
    env = {
        "REPLICAFT_LIGHTHOUSE": "10.0.0.9:29510",
        "REPLICAFT_REPLICA_ID": "g3",
        "REPLICAFT_MIN_REPLICAS": "2",
        "REPLICAFT_HOST": "10.0.0.3",
        "REPLICAFT_TOKEN": "s3cret",
        "REPLICAFT_BACKEND": "gloo",
        "REPLICAFT_QUORUM_TIMEOUT_S": "90",
        "REPLICAFT_HEAL_TIMEOUT_S": "45.5",
        "REPLICAFT_EVENTS_DIR": "/tmp/events",
        "REPLICAFT_DIGEST_EVERY_STEPS": "0",
        "REPLICAFT_SEED": "1234",
        "REPLICAFT_FAULT_POINTS": "allreduce@5",
    }
    options = ManagerOptions.from_env(env)
    assert options == ManagerOptions(
        lighthouse="10.0.0.9:29510",
        replica_id="g3",
        min_replicas=2,
        host="10.0.0.3",
        token="s3cret",
        backend="gloo",
        quorum_timeout_s=90.0,
        heal_timeout_s=45.5,
        events_dir="/tmp/events",
        digest_every_steps=0,
        seed=1234,
        fault_points="allreduce@5",
    )
    assert isinstance(options.quorum_timeout_s, float) and isinstance(options.min_replicas, int)


def test_from_env_reads_torchrun_rank_world_size_and_store() -> None:
    env = {
        **{f"REPLICAFT_{k.upper()}": v for k, v in REQUIRED.items()},
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
    }
    options = ManagerOptions.from_env(env)
    assert (options.group_rank, options.group_world_size, options.group_store) == (1, 2, "10.0.0.1:29500")


def test_from_env_replicaft_variables_win_over_torchrun_ones() -> None:
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "REPLICAFT_GROUP_RANK": "0",
        "REPLICAFT_GROUP_WORLD_SIZE": "3",
        "REPLICAFT_GROUP_STORE": "store:1",
    }
    options = ManagerOptions.from_env(env, **REQUIRED)
    assert (options.group_rank, options.group_world_size, options.group_store) == (0, 3, "store:1")


def test_from_env_master_addr_without_port_sets_no_store() -> None:
    options = ManagerOptions.from_env({"MASTER_ADDR": "10.0.0.1"}, **REQUIRED)
    assert options.group_store is None


def test_from_env_explicit_arguments_win_over_the_environment() -> None:
    env = {
        "REPLICAFT_LIGHTHOUSE": "env:1",
        "REPLICAFT_REPLICA_ID": "from-env",
        "REPLICAFT_SEED": "7",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "a",
        "MASTER_PORT": "1",
    }
    options = ManagerOptions.from_env(
        env, lighthouse="arg:2", replica_id="from-arg", seed=8, group_rank=0, group_world_size=1
    )
    assert (options.lighthouse, options.replica_id, options.seed) == ("arg:2", "from-arg", 8)
    assert (options.group_rank, options.group_world_size) == (0, 1)


def test_from_env_explicit_none_leaves_the_environment_value() -> None:
    options = ManagerOptions.from_env({"REPLICAFT_TOKEN": "t"}, token=None, **REQUIRED)
    assert options.token == "t"


def test_from_env_ignores_unrelated_variables() -> None:
    options = ManagerOptions.from_env({"REPLICAFT": "x", "LOCAL_RANK": "3", "TOKEN": "t"}, **REQUIRED)
    assert options == build()


def test_from_env_reads_os_environ_when_given_no_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLICAFT_LIGHTHOUSE", "127.0.0.1:1")
    monkeypatch.setenv("REPLICAFT_REPLICA_ID", "from-os")
    assert ManagerOptions.from_env().replica_id == "from-os"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param(
            {"REPLICAFT_REPLICA_ID": "g0"},
            "lighthouse is not set; pass it or set REPLICAFT_LIGHTHOUSE",
            id="lighthouse",
        ),
        pytest.param(
            {"REPLICAFT_LIGHTHOUSE": "h:1"},
            "replica_id is not set; pass it or set REPLICAFT_REPLICA_ID",
            id="replica_id",
        ),
    ],
)
def test_from_env_missing_required_field_says_how_to_set_it(env: dict[str, str], message: str) -> None:
    with pytest.raises(OptionsError, match=message):
        ManagerOptions.from_env(env)


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        pytest.param("REPLICAFT_MIN_REPLICAS", "two", "REPLICAFT_MIN_REPLICAS='two' is not an integer", id="word"),
        pytest.param("REPLICAFT_SEED", "1.5", "REPLICAFT_SEED='1.5' is not an integer", id="float_for_int"),
        pytest.param(
            "REPLICAFT_QUORUM_TIMEOUT_S", "60s", "REPLICAFT_QUORUM_TIMEOUT_S='60s' is not a number", id="unit_suffix"
        ),
        pytest.param("RANK", "zero", "RANK='zero' is not an integer", id="torchrun_rank"),
        pytest.param("WORLD_SIZE", "", "WORLD_SIZE='' is not an integer", id="torchrun_world_size"),
    ],
)
def test_from_env_bad_number_names_the_variable_and_value(name: str, raw: str, message: str) -> None:
    with pytest.raises(OptionsError) as raised:
        ManagerOptions.from_env({name: raw}, **REQUIRED)
    assert str(raised.value).startswith(message)
    assert "set it to" in str(raised.value)


def test_from_env_values_are_validated_like_arguments() -> None:
    with pytest.raises(OptionsError, match="quorum_timeout_s=10.0 is not above collective_timeout_s=10.0"):
        ManagerOptions.from_env({"REPLICAFT_QUORUM_TIMEOUT_S": "10"}, **REQUIRED)


def test_from_env_empty_variable_means_unset() -> None:
    options = ManagerOptions.from_env(
        {"REPLICAFT_LIGHTHOUSE": "127.0.0.1:29510", "REPLICAFT_REPLICA_ID": "g0", "REPLICAFT_HEAL_TIMEOUT_S": ""}
    )
    assert options.heal_timeout_s == ManagerOptions(lighthouse="127.0.0.1:29510", replica_id="g0").heal_timeout_s


def test_deterministic_mode_read_from_env_and_checked() -> None:
    env = {
        **{f"REPLICAFT_{k.upper()}": v for k, v in REQUIRED.items()},
        "REPLICAFT_DETERMINISTIC": "true",
        "REPLICAFT_VIRTUAL_SHARDS": "6",
    }
    options = ManagerOptions.from_env(env)
    assert (options.deterministic, options.virtual_shards) == (True, 6)
    assert ManagerOptions.from_env({**env, "REPLICAFT_DETERMINISTIC": "0"}).deterministic is False
    with pytest.raises(OptionsError, match="REPLICAFT_DETERMINISTIC='maybe' is not a boolean; set it to 1 or 0"):
        ManagerOptions.from_env({**env, "REPLICAFT_DETERMINISTIC": "maybe"})
    with pytest.raises(OptionsError, match=r"virtual_shards=0 is outside \[1, 65536\].*at least the most groups"):
        build(virtual_shards=0)
    with pytest.raises(OptionsError, match="supports groups of one rank"):
        build(deterministic=True, group_world_size=2, group_store="h:1")


# -- every numeric field, derived from the dataclass so a new field is covered (issue 19) ------


def numeric_fields(cls: type) -> list[tuple[str, str]]:
    return [(f.name, str(f.type)) for f in dataclasses.fields(cls) if f.type in ("int", "float")]


NUMERIC_FIELDS = numeric_fields(ManagerOptions)
CHECKPOINT_NUMBERS = numeric_fields(CheckpointOptions)
STRING_FIELDS = [f.name for f in dataclasses.fields(ManagerOptions) if f.type in ("str", "str | None")]
BAD_NUMBERS = [math.nan, math.inf, -math.inf, -1, 1e12]
"""Fed to every numeric field: none is a usable value for any of them."""
BAD_INTEGERS = [0.5, True, 2**64, "2"]
"""Fed to every integer field besides: a float, a bool (it would read as 1), a huge int, a string."""


def build_checkpoint_options(**fields: Any) -> CheckpointOptions:
    return CheckpointOptions(directory="/ckpt", **fields)


@pytest.mark.parametrize(
    ("builder", "name", "value"),
    [
        pytest.param(builder, n, v, id=f"{builder.__name__}-{n}-{v!r}")
        for builder, numbers in ((build, NUMERIC_FIELDS), (build_checkpoint_options, CHECKPOINT_NUMBERS))
        for n, t in numbers
        for v in BAD_NUMBERS + (BAD_INTEGERS if t == "int" else [True, "2.0"])
    ],
)
def test_every_numeric_field_refuses_nonfinite_negative_huge_and_wrong_types(
    builder: Callable[..., object], name: str, value: Any
) -> None:
    # ManagerOptions and the checkpoint's own options, each over its dataclass's fields.
    with pytest.raises(OptionsError) as raised:
        builder(**{name: value})
    assert str(raised.value).startswith(f"{name}={value!r} "), str(raised.value)


def test_the_numeric_field_list_is_the_whole_class() -> None:
    # A guard on the derivation above: if field types stopped being the plain strings "int" and
    # "float" (annotations evaluated, say), the parametrization would silently shrink.
    assert len(NUMERIC_FIELDS) >= 25
    assert {"quorum_timeout_s", "checkpoint_keep_last", "checkpoint_interval_s", "seed"} <= {
        n for n, _ in NUMERIC_FIELDS
    }


@pytest.mark.parametrize("name", STRING_FIELDS)
@pytest.mark.parametrize("value", [5, b"g0", "a\x00b"], ids=repr)
def test_every_string_field_refuses_other_types_and_nul(name: str, value: Any) -> None:
    with pytest.raises(OptionsError) as raised:
        build(**{name: value})
    assert str(raised.value).startswith(f"{name}={value!r} "), str(raised.value)


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param(
            {"quorum_timeout_s": 86400.0, "heal_timeout_s": 86399.0, "collective_timeout_s": 86399.0}, id="a_day"
        ),
        pytest.param(
            {
                "checkpoint_dir": "/ckpt",
                "checkpoint_interval_s": 0.0,
                "checkpoint_interval_steps": 5,
                "checkpoint_keep_last": 0,
                "checkpoint_compression_level": 22,
            },
            id="checkpoint_edges",
        ),
        pytest.param(
            {"replica_id": "j" * 128, "seed": 2**63 - 1, "heal_replay_steps": 0, "heal_replay_bytes": 0},
            id="longest_id_largest_seed",
        ),
        pytest.param({"quorum_timeout_s": 90, "min_replicas": 65536}, id="int_for_float"),
    ],
)
def test_values_at_the_edges_accepted(fields: dict[str, Any]) -> None:
    assert build(**fields) is not None


def test_checkpoint_keep_last_negative_refused_at_construction_issue_19() -> None:
    with pytest.raises(OptionsError, match="keep_last=-1 is out of range"):
        CheckpointOptions(directory="/ckpt", keep_last=-1)
    assert {n for n, _ in CHECKPOINT_NUMBERS} >= {"keep_last", "interval_s", "chain_length", "free_space_margin"}


# -- the environment --------------------------------------------------------------------------


def test_from_env_misspelt_variable_is_an_error_suggesting_the_known_one_issue_19() -> None:
    env = {**{f"REPLICAFT_{k.upper()}": v for k, v in REQUIRED.items()}, "REPLICAFT_QUORUM_TIMEOUT": "5"}
    with pytest.raises(OptionsError) as raised:
        ManagerOptions.from_env(env)
    assert str(raised.value).startswith("REPLICAFT_QUORUM_TIMEOUT is set, but replicaft reads no variable of that name")
    assert "did you mean REPLICAFT_QUORUM_TIMEOUT_S?" in str(raised.value)


def test_from_env_unknown_variable_with_nothing_close_lists_the_known_ones() -> None:
    with pytest.raises(OptionsError, match="REPLICAFT_XYZZY is set.*the known ones are .*REPLICAFT_LIGHTHOUSE"):
        ManagerOptions.from_env({"REPLICAFT_XYZZY": "1"}, **REQUIRED)


@pytest.mark.parametrize("name", sorted(READ_OUTSIDE_THE_LIBRARY))
def test_from_env_accepts_the_variables_scripts_around_the_library_set(name: str) -> None:
    assert ManagerOptions.from_env({name: "x"}, **REQUIRED) == build()


def test_from_env_empty_token_is_the_lighthouses_error_issue_19() -> None:
    with pytest.raises(lighthouse_errors.OptionsError) as lighthouse_raised:
        LighthouseOptions.token_from_env({"REPLICAFT_TOKEN": ""})
    with pytest.raises(OptionsError) as raised:
        ManagerOptions.from_env({"REPLICAFT_TOKEN": ""}, **REQUIRED)
    assert str(raised.value) == str(lighthouse_raised.value)


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("REPLICAFT_HEARTBEAT_INTERVAL_S", "nan", "REPLICAFT_HEARTBEAT_INTERVAL_S=nan is outside [0.001, 86400]"),
        ("REPLICAFT_CHECKPOINT_INTERVAL_S", "nan", "REPLICAFT_CHECKPOINT_INTERVAL_S=nan is outside"),
        ("REPLICAFT_QUORUM_TIMEOUT_S", "1e6", "REPLICAFT_QUORUM_TIMEOUT_S=1000000.0 is outside [0.001, 86400]"),
        ("REPLICAFT_PREEMPTION_GRACE_S", "inf", "REPLICAFT_PREEMPTION_GRACE_S=inf is outside"),
        ("REPLICAFT_CHECKPOINT_KEEP_LAST", "-1", "REPLICAFT_CHECKPOINT_KEEP_LAST=-1 is outside"),
        ("WORLD_SIZE", "0", "WORLD_SIZE=0 is outside [1, 65536]"),
    ],
)
def test_from_env_out_of_range_value_names_the_variable(name: str, raw: str, message: str) -> None:
    with pytest.raises(OptionsError) as raised:
        ManagerOptions.from_env({name: raw}, **REQUIRED)
    assert str(raised.value).startswith(message), str(raised.value)


def test_from_env_unknown_keyword_argument_is_an_options_error() -> None:
    with pytest.raises(OptionsError, match="ManagerOptions has no option 'quorum_timeout'"):
        ManagerOptions.from_env({}, quorum_timeout=5.0, **REQUIRED)


_SET_OR_READ = re.compile(r"""["'](REPLICAFT_[A-Z0-9_]*[A-Z0-9])["']|\b(REPLICAFT_[A-Z0-9_]*[A-Z0-9])(?:=|:-)""")
"""A name quoted in code, or assigned (``NAME=``, ``dict(NAME=...)``, ``${NAME:-...}``) in code and scripts."""


def test_every_replicaft_variable_the_repository_sets_or_reads_is_known() -> None:
    misspelt_on_purpose = {Path(__file__).name, "test_fuzz_options.py"}
    files = [
        p
        for p in REPO_ROOT.rglob("*")
        if p.suffix in (".py", ".sh", ".sbatch", ".yaml", ".yml")
        and p.is_file()
        and not {".venv", ".venv-torchtitan", ".git", "node_modules"} & set(p.parts)
        and p.name not in misspelt_on_purpose
    ]
    assert len(files) > 50
    named = {m.group(1) or m.group(2) for p in files for m in _SET_OR_READ.finditer(p.read_text(errors="replace"))}
    assert {"REPLICAFT_REPO", "REPLICAFT_LIGHTHOUSE", "REPLICAFT_CHECKPOINT_KEY"} <= named
    assert named - KNOWN_VARIABLES == set()
