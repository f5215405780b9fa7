"""torchft's own example programs, ``train_ddp.py`` and ``train_diloco.py``, fetched, not copied.

They are not in torchft's wheel, only in its source distribution on PyPI. The project keeps
no copy of another project's code, so this module downloads that sdist once (its sha256 is
pinned: a changed file is refused, never run), takes the two programs out of it and keeps them
under the git-ignored ``.cache/torchft-0.2.0/``. ``tests/replicaft/compat/test_torchft_programs.py`` runs them
unchanged under ``replicaft-launch --torchft``, and so can anyone:

    python -m benchmarks.torchft_examples             # prints the two paths
    PYTHONPATH=benchmarks/torchft_offline replicaft-launch --torchft --groups 2 \\
        --replica-prefix train_ddp_ .cache/torchft-0.2.0/train_ddp.py

``benchmarks/torchft_offline`` is the offline data that ``train_ddp.py`` gets in place of
CIFAR-10's download (a stand-in ``torchvision``, see its docstring). ``train_diloco.py`` makes
its own data; it needs tensorboard and writes ``output/`` in its working directory.

Rejected: ``pip download --no-binary`` (it installs the sdist's build backend, maturin, to read
its metadata, all to get two text files) and a git checkout of torchft (a second source, not
the release the shim follows).
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SDIST_URL = (
    "https://files.pythonhosted.org/packages/52/15/3367ff63ca3b551cfaf7821cea8f064f77e2dbf6b2705bc5adb154e7375b/"
    "torchft-0.2.0.tar.gz"
)
SDIST_SHA256 = "542e17910039735d6686517f98ed49686ba23fc4283b15cf1d984a251eb1546a"
PROGRAMS = ("train_ddp.py", "train_diloco.py")
"""At the top of the sdist, as ``torchft-0.2.0/<name>``."""
CACHE_DIR = REPO / ".cache" / "torchft-0.2.0"
OFFLINE_DATA_DIR = REPO / "benchmarks" / "torchft_offline"
"""Put first on the PYTHONPATH of a run of ``train_ddp.py``: its ``torchvision`` is the stand-in."""
DOWNLOAD_TIMEOUT_S = 60.0
"""The sdist is 4.5 MB; a minute covers a slow proxy and still fails a test in reasonable time."""


class ProgramUnavailable(RuntimeError):
    """The sdist could not be downloaded (no network); the message names the URL."""


def program_path(name: str, cache_dir: Path = CACHE_DIR) -> Path:
    """The path of torchft's ``name`` (one of :data:`PROGRAMS`), downloading it the first time.

    Blocks for the download (at most :data:`DOWNLOAD_TIMEOUT_S`). Raises ProgramUnavailable
    when the sdist cannot be fetched, ValueError when what was fetched is not the pinned file."""
    if name not in PROGRAMS:
        raise ValueError(f"{name!r} is not one of torchft 0.2.0's example programs {PROGRAMS}")
    path = cache_dir / name
    if not path.is_file():
        extract_programs(download_sdist(), cache_dir)
    return path


def download_sdist(url: str = SDIST_URL, sha256: str = SDIST_SHA256) -> bytes:
    """The sdist's bytes, checked against ``sha256``."""
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            data = response.read()
    except (urllib.error.URLError, OSError) as e:
        raise ProgramUnavailable(f"cannot download torchft's sdist from {url}: {e}") from e
    return check_sha256(data, sha256, url)


def check_sha256(data: bytes, sha256: str, url: str) -> bytes:
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise ValueError(
            f"{url} has sha256 {got}, expected {sha256}: not the torchft 0.2.0 release; refusing to run it"
        )
    return data


def extract_programs(sdist: bytes, cache_dir: Path) -> None:
    """Write :data:`PROGRAMS` from the sdist into ``cache_dir``: those two members and nothing
    else (no path from the archive is used, so none can escape the folder)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(sdist), mode="r:gz") as archive:
        for name in PROGRAMS:
            member = archive.extractfile(f"torchft-0.2.0/{name}")
            if member is None:
                raise ValueError(f"torchft-0.2.0/{name} in {SDIST_URL} is not a regular file")
            # Written beside, then renamed: two test processes fetching at once never see half a file.
            partial = cache_dir / f".{name}.{os.getpid()}"
            partial.write_bytes(member.read())
            partial.replace(cache_dir / name)


def main() -> int:
    try:
        for name in PROGRAMS:
            print(program_path(name))
    except ProgramUnavailable as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
