"""Whether a user's DataLoader can be read in the exactly-once order: a map-style dataset, no order of its own.

Exactly-once decides which positions of the dataset each step trains on (the cursor splits a
step among the groups that contribute and loads an aborted step's positions again), so
replicaft reads a user's loader only for its dataset and settings, never for its order. Three
things would be silently overridden, so :func:`check_map_style` refuses them: an
iterable-style dataset (it yields samples in its own order, none can be read by position), a
sampler of the user's (``shuffle`` is fine: the order is the cursor's seeded per-epoch
permutation either way) and a ``batch_sampler`` of the user's.

Both ways in call it: ``StepDataLoader.from_loader`` (a torchdata ``StatefulDataLoader``,
stateful.py) and the Lightning strategy's train DataLoader (lightning/step_batches.py); each
adds the refusals of its own path. The samplers a loader makes itself are torch's for a
``DataLoader``; torchdata is an optional dependency, so the caller that reads a
``StatefulDataLoader`` names that loader's own sampler classes rather than this module
importing torchdata.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from replicaft.errors import OptionsError


def check_map_style(
    loader: torch.utils.data.DataLoader,
    *,
    where: str,
    loader_name: str,
    random_samplers: tuple[type, ...] = (RandomSampler,),
    batch_samplers: tuple[type, ...] = (BatchSampler,),
) -> None:
    """Refuse (``OptionsError``) a loader whose dataset or order exactly-once cannot honour.

    ``where`` is the API that was called and ``loader_name`` how the message names the loader
    (``"StepDataLoader.from_loader"``, ``"the loader"``). ``random_samplers`` and
    ``batch_samplers`` are the classes the loader makes itself for ``shuffle=True`` and for
    ``batch_size`` (a ``StatefulDataLoader`` has its own); any other sampler is the user's.
    """
    dataset = loader.dataset
    if isinstance(dataset, torch.utils.data.IterableDataset):
        raise OptionsError(
            f"{where}: {loader_name}'s dataset is an iterable-style {type_name(dataset)}: it yields samples in "
            "its own order, so replicaft can neither give each step the positions the exactly-once cursor "
            "assigns nor load an aborted step's samples again; use a map-style dataset (a torch Dataset with "
            "__getitem__ and __len__, or a datasets.Dataset: load_dataset(...) without streaming=True)"
        )
    s = loader.sampler
    own = isinstance(s, SequentialSampler) or (
        isinstance(s, random_samplers) and not s.replacement and s.num_samples == len(dataset)
    )
    if not own:
        raise OptionsError(
            f"{where}: {loader_name} has sampler={type_name(s)}: under replicaft the exactly-once cursor decides "
            "which samples each step trains on (it splits a step among the groups that contribute and loads "
            "an aborted step's samples again), so a sampler of its own cannot be honoured; make "
            f"{loader_name} without one (shuffle=True or False: the order is the exactly-once cursor's seeded "
            "permutation)"
        )
    b = loader.batch_sampler
    if b is not None and (type(b) not in batch_samplers or b.sampler is not s):
        raise OptionsError(
            f"{where}: {loader_name} has batch_sampler={type_name(b)}: under replicaft each step's batches are "
            "the exactly-once cursor's positions, so a batch sampler of its own cannot be honoured; make "
            f"{loader_name} with batch_size instead"
        )


def type_name(obj: Any) -> str:
    """``obj``'s class with its module, as an error message names what it received."""
    return f"{type(obj).__module__}.{type(obj).__qualname__}"
