"""The lineage a group's state belongs to: which history its checkpoints continue.

A lineage id (checkpoint/layout.py) names one history of training steps, so two runs that
both reach step 400 never take each other's checkpoint for their own. It is training state:
the persistence duties register it with the manager (``STATE_NAME``), so a heal hands it over
with the rest and whichever group writes names the same history. A run that starts from
nothing mints one (every group at step 0 adopts the first donor's through the initial sync);
a resume continues the loaded checkpoint's, unless newer checkpoints of that lineage failed
to load, or it predates lineages: then it forks a new one, since its steps are not the ones
those checkpoints hold. The fork is derived from the resume's ``occasion`` (the same on every
group that resumes together), so those groups fork to the same id without talking.

Kept apart from duties.py because it is a rule over ids, not a part of saving: it holds no
writer, reader or thread.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from replicaft.checkpoint.layout import LEGACY_LINEAGE, forked_lineage, is_lineage, lineage_label, new_lineage

if TYPE_CHECKING:
    from replicaft.checkpoint import LoadedCheckpoint

logger = logging.getLogger(__name__)


class Lineage:
    """The current lineage of one rank's state. Training thread only."""

    def __init__(self, replica_id: str, *, has_checkpoints: bool) -> None:
        """``has_checkpoints``: the job keeps checkpoints (a ``checkpoint_dir``); without, the
        lineage stays the legacy one, which names no history."""
        self._replica_id = replica_id
        self._has_checkpoints = has_checkpoints
        self.current = new_lineage() if has_checkpoints else LEGACY_LINEAGE

    def state_dict(self) -> dict[str, Any]:
        return {"lineage": self.current}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Adopt the lineage of a donor's state (a heal) or of a loaded checkpoint; a value that
        is not a lineage id is ignored with a warning, and the legacy one never replaces a real one."""
        lineage = state.get("lineage") if isinstance(state, dict) else None
        if not is_lineage(lineage):
            logger.warning(
                "[%s] ignoring lineage %r in the loaded state (not a lineage id); keeping %s",
                self._replica_id,
                lineage,
                lineage_label(self.current),
            )
            return
        assert isinstance(lineage, str)
        if lineage != LEGACY_LINEAGE or not self._has_checkpoints:
            self.current = lineage

    def resumed(self, loaded: LoadedCheckpoint, occasion: str) -> None:
        """Continue ``loaded``'s lineage, or fork a new one from it (module docstring)."""
        if loaded.lineage == LEGACY_LINEAGE or not loaded.newest_in_lineage:
            self.current = forked_lineage(loaded.lineage, loaded.step, occasion)
            why = (
                "it was written before lineages existed"
                if loaded.lineage == LEGACY_LINEAGE
                else f"newer checkpoints of lineage {loaded.lineage} did not load"
            )
            logger.warning(
                "[%s] resumed from step %d; %s, so this run continues as the new lineage %s",
                self._replica_id,
                loaded.step,
                why,
                self.current,
            )
        else:
            self.current = loaded.lineage
