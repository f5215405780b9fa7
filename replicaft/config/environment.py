"""What the environment sets of ``ManagerOptions``: its ``REPLICAFT_<FIELD>`` variables and torchrun's.

The environment is read in one place, ``ManagerOptions.from_env``, which entry points call and
library code never does; explicit arguments win over what is read here. Two steps, in the
order ``from_env`` takes them: :func:`check_environment` refuses what no value can excuse (a
``REPLICAFT_*`` name nothing reads, env_names.py; an empty ``REPLICAFT_TOKEN``, which used to
turn authentication off without a word, so it is an error here as for the lighthouse), then
:func:`environment_values` parses each field's variable by the field's type. An empty variable
means unset. torchrun's ``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR``/``MASTER_PORT`` give the
group's place where no ``REPLICAFT_*`` variable does. Ranges are checked by ``from_env``
(against option_ranges.py, naming the variable), not here, so that an explicit argument that
replaces a bad variable is not refused for it.

Torch-free, like ``replicaft/config/options.py``, which imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lighthouse import errors as lighthouse_errors
from lighthouse.config.options import LighthouseOptions
from replicaft.config.env_names import ENV_PREFIX, check_variable_names
from replicaft.errors import OptionsError

TORCHRUN_VARIABLES = (("group_rank", "RANK"), ("group_world_size", "WORLD_SIZE"))
"""The fields torchrun's variables set when no ``REPLICAFT_*`` one does (and ``group_store``
from ``MASTER_ADDR`` and ``MASTER_PORT``)."""


def check_environment(env: Mapping[str, str], known: frozenset[str]) -> None:
    """Raise OptionsError for a ``REPLICAFT_*`` variable not in ``known`` (naming the closest
    known one) or an empty ``REPLICAFT_TOKEN``; checks names only, parses no value."""
    check_variable_names(env, known)
    try:
        LighthouseOptions.token_from_env(env)
    except lighthouse_errors.OptionsError as e:
        raise OptionsError(str(e)) from None


def environment_values(env: Mapping[str, str], field_types: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The fields ``env`` sets, each parsed by its type in ``field_types`` (``"int"``,
    ``"float | None"``, ...), and the variable each came from (for messages). Raises
    OptionsError naming the variable and its value when it does not parse."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, type_name in field_types.items():
        env_name = ENV_PREFIX + name.upper()
        raw = env.get(env_name)
        if raw:
            values[name], sources[name] = _parse(env_name, type_name, raw), env_name
    for name, env_name in TORCHRUN_VARIABLES:
        if env_name in env and name not in values:
            values[name], sources[name] = _parse(env_name, "int", env[env_name]), env_name
    if "MASTER_ADDR" in env and "MASTER_PORT" in env and "group_store" not in values:
        values["group_store"] = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    return values, sources


def _parse(env_name: str, type_name: str, raw: str) -> Any:
    if type_name.startswith("bool"):
        if raw.lower() not in ("1", "true", "yes", "0", "false", "no"):
            raise OptionsError(f"{env_name}={raw!r} is not a boolean; set it to 1 or 0 (true/false) or unset it")
        return raw.lower() in ("1", "true", "yes")
    try:
        if type_name.startswith("int"):
            return int(raw)
        if type_name.startswith("float"):
            return float(raw)
    except ValueError:
        kind = "an integer" if type_name.startswith("int") else "a number"
        raise OptionsError(f"{env_name}={raw!r} is not {kind}; set it to {kind} or unset it") from None
    return raw
