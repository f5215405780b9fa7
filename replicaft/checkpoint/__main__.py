"""``replicaft-ckpt`` (= ``python -m replicaft.checkpoint``): look at checkpoints from a shell.

::

    replicaft-ckpt list DIR                     step, lineage, size, age and validity, newest first
    replicaft-ckpt list --no-verify DIR         the same without reading every byte
    replicaft-ckpt verify DIR/step-000000400-…  exit 0 if intact, 1 if not (the message says why)
    replicaft-ckpt export DIR --format safetensors --out OUT [--optimizer]
                                                model.safetensors (and optimizer.safetensors) of the
                                                checkpoint DIR, or of the newest valid one in DIR
    replicaft-ckpt import FILE.safetensors... --into DIR [--step N]
                                                a checkpoint of those files, for a warm start

An encrypted checkpoint is read with the key in ``REPLICAFT_CHECKPOINT_KEY_FILE`` (or
``REPLICAFT_CHECKPOINT_KEY``); ``import`` encrypts with it when one is set. Bad arguments
(unknown command, missing directory) print one line and exit 2, so scripts can tell "the
checkpoint is bad" (1) from "you called me wrong" (2).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from replicaft.checkpoint.entries import scan
from replicaft.checkpoint.export import export_safetensors, import_safetensors
from replicaft.checkpoint.keys import key_from_env
from replicaft.checkpoint.layout import is_tmp_dirname, lineage_label, parse_dirname
from replicaft.checkpoint.reader import LoadedCheckpoint, load, verify
from replicaft.checkpoint.tiers import CheckpointReader
from replicaft.errors import CheckpointCorrupt, CheckpointKeyError, OptionsError, StateError

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="replicaft-ckpt", description="List and verify replicaft persistent checkpoints.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    list_cmd = commands.add_parser("list", help="list the checkpoints in a directory, newest first")
    list_cmd.add_argument("directory", type=Path)
    list_cmd.add_argument("--no-verify", action="store_true", help="do not read and hash every file (fast)")
    verify_cmd = commands.add_parser("verify", help="check every file of one checkpoint against its manifest")
    verify_cmd.add_argument("checkpoint", type=Path, help="a checkpoint directory, e.g. DIR/step-000000400-…")
    export_cmd = commands.add_parser("export", help="write a checkpoint's model (and optimizer) as safetensors")
    export_cmd.add_argument("checkpoint", type=Path, help="a checkpoint directory, or a directory of checkpoints (the newest valid)")
    export_cmd.add_argument("--format", choices=["safetensors"], default="safetensors")
    export_cmd.add_argument("--out", type=Path, required=True, help="directory for <entry>.safetensors")
    export_cmd.add_argument("--optimizer", action="store_true", help="also write optimizer.safetensors")
    export_cmd.add_argument("--entry", action="append", default=[], help="another top-level state entry to write")
    import_cmd = commands.add_parser("import", help="make a checkpoint of safetensors files (a warm start)")
    import_cmd.add_argument("files", type=Path, nargs="+", help="<entry>.safetensors files (model.safetensors, ...)")
    import_cmd.add_argument("--into", type=Path, required=True, help="the checkpoint directory to write it into")
    import_cmd.add_argument("--step", type=int, default=0, help="the step it resumes at (default 0)")
    return parser


def _size(num_bytes: int) -> str:
    if num_bytes < 1024:
        return f"{num_bytes} B"
    size = num_bytes / 1024
    for unit in ("KiB", "MiB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _age(seconds: float) -> str:
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds / length:.1f}{unit}"
    return f"{max(seconds, 0):.0f}s"


def _list(directory: Path, verify_files: bool) -> int:
    reader = CheckpointReader(directory)
    infos = reader.list(verify_files=verify_files)
    if not infos:
        print(f"no published checkpoints in {directory}")
    for info in infos:
        validity = {True: "valid", False: f"INVALID: {info.reason}", None: "not verified"}[info.valid]
        print(f"{info.step:>10}  {lineage_label(info.lineage):>14}  {_size(info.num_bytes):>10}  "
              f"{_age(info.age_s):>7} ago  {validity}")
    for path, why in reader.ignored():
        print(f"{path.name}: {why}")
    partial = sorted(e.path.name for e in scan(directory) if e.is_dir and is_tmp_dirname(e.path.name))
    if partial:
        print(f"{len(partial)} unpublished (ignored; the next writer removes them): {', '.join(partial)}")
    return EXIT_OK


def _verify(checkpoint: Path) -> int:
    ok, reason = verify(checkpoint)
    print(f"valid: {reason}" if ok else f"INVALID: {reason}")
    return EXIT_OK if ok else EXIT_INVALID


def _export(args: argparse.Namespace) -> int:
    key = key_from_env(os.environ)
    if parse_dirname(args.checkpoint.name) is not None:
        loaded: LoadedCheckpoint | None = load(args.checkpoint, key=key)
    else:
        loaded = CheckpointReader(args.checkpoint, encryption_key=key).load_latest_valid()
    if loaded is None:
        print(f"INVALID: no valid checkpoint in {args.checkpoint}")
        return EXIT_INVALID
    entries = ["model", *(["optimizer"] if args.optimizer else []), *args.entry]
    for path in export_safetensors(loaded, args.out, entries):
        print(f"wrote {path} (step {loaded.step}, from {loaded.path.name})")
    return EXIT_OK


def _import(args: argparse.Namespace) -> int:
    path = import_safetensors(args.files, args.into, step=args.step, encryption_key=key_from_env(os.environ))
    print(f"wrote {path}: a job with checkpoint_dir={args.into} resumes from it at step {args.step}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "export":
            return _export(args)
        if args.command == "import":
            return _import(args)
    except (CheckpointCorrupt, StateError) as e:
        print(f"INVALID: {e}")
        return EXIT_INVALID
    except (CheckpointKeyError, OptionsError) as e:
        parser.error(str(e))
    if args.command == "list":
        if not args.directory.is_dir():
            parser.error(f"{args.directory} is not a directory")
        return _list(args.directory, not args.no_verify)
    if not args.checkpoint.is_dir():
        parser.error(f"{args.checkpoint} is not a directory; pass a checkpoint such as DIR/step-000000400")
    return _verify(args.checkpoint)


if __name__ == "__main__":
    sys.exit(main())
