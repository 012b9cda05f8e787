"""Resume only from checkpoints this user's runs wrote: a signed manifest beside every verl checkpoint.

verl's checkpoint manager reads its files with pickle (the model, optimizer and extra state shards, the data
loader's ``data.pt``), and unpickling runs whatever code the file names. So a verl checkpoint directory is
code, and resuming from one that came from elsewhere runs that code. At save, :func:`write_manifest` writes
``seal_manifest.json`` into the ``global_step_N`` folder: the run that wrote it, the step, the sha256 of every
file in the folder, and an HMAC-SHA256 of all that under a key private to this user (:func:`signing_key`,
``~/.config/seal/checkpoint_key``, mode 0600, made on first use). Before verl loads a folder,
:func:`check_checkpoint` recomputes the hashes and the HMAC: a folder without a valid manifest (written
elsewhere, by another user, edited, or by an older version) is refused unless the recipe says
``trainer.trust_checkpoint: true``. Hashes alone would not do: whoever crafts a checkpoint can also write
their hashes; the HMAC needs the key, which never leaves this user's configuration directory.

The manifest also binds the files to their place: its run and step must be those of the folder it sits in
(``<run>/checkpoints/global_step_<step>``), so a signed save copied to another step's folder, or into another
run, is refused like an unsigned one. And it records what the save holds (``contents``): ``full`` (resumable)
or ``hf_export`` (the checkpoint policy dropped its shards and optimizer, ``seal.engines.checkpoint_policy``;
re-signed over what is left by :func:`resign_subset`, without hashing again).

Cost: one sha256 pass over the checkpoint at save (in a background thread, files hashed in parallel:
``seal.engines.checkpoint_policy.SaveSigner``) and one at resume (docs/verl_engine.md).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

MANIFEST_FILE = "seal_manifest.json"
MANIFEST_FORMAT = 2  # 2 adds `contents`; a format-1 manifest (no `contents`) is a full save
FULL, HF_EXPORT = "full", "hf_export"  # what a signed save holds: resumable, or the HF export only
VERL_STEP_PREFIX = "global_step_"  # seal.run_dir.VERL_STEP_PREFIX (verl parses the step from the name)
HASH_THREADS = 8  # files hashed at once: hashlib releases the GIL, a save is several large files
KEY_FILE = "checkpoint_key"
TRUST_KNOB = "trainer.trust_checkpoint"


class UntrustedCheckpoint(RuntimeError):
    """A checkpoint directory whose manifest is missing, forged or out of date: resuming would unpickle it."""


def key_path() -> Path:
    """This user's signing key: ``$XDG_CONFIG_HOME/seal/checkpoint_key`` (default ``~/.config``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "seal" / KEY_FILE


def signing_key(create: bool) -> bytes | None:
    """The key's bytes; made (32 random bytes, owner-only) when `create` and absent; None when absent."""
    path = key_path()
    if not path.is_file():
        if not create:
            return None
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first: use theirs
            pass
        else:
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32) + "\n")
    if path.stat().st_mode & 0o077:
        raise UntrustedCheckpoint(f"{path}: the checkpoint signing key is readable by others (chmod 600 it)")
    return bytes.fromhex(path.read_text().strip())


def _file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder` but the manifest, by path relative to it, several files at once. A
    symbolic link is refused: verl writes none, and one could point the loader at a file the manifest never saw."""
    paths: list[Path] = []
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            raise UntrustedCheckpoint(f"{path}: a symbolic link inside a checkpoint")
        if path.is_file() and path.relative_to(folder).as_posix() != MANIFEST_FILE:
            paths.append(path)

    def digest(path: Path) -> str:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()

    with ThreadPoolExecutor(max_workers=max(1, min(HASH_THREADS, len(paths)))) as pool:
        digests = list(pool.map(digest, paths))
    return {path.relative_to(folder).as_posix(): d for path, d in zip(paths, digests, strict=True)}


def _signature(key: bytes, body: dict[str, Any]) -> str:
    payload = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, payload, hashlib.sha256).hexdigest()


def write_manifest(folder: str | os.PathLike[str], run: str | os.PathLike[str], step: int,
                   contents: str = FULL, files: dict[str, str] | None = None) -> Path:
    """Sign `folder` (a ``global_step_N`` folder, complete): written last, after every file of the step. `run`
    is the run directory the folder sits in (recorded resolved); `files` (path -> sha256) replaces hashing
    them, for :func:`resign_subset` only."""
    folder = Path(folder)
    key = signing_key(create=True)
    assert key is not None
    if contents not in (FULL, HF_EXPORT):
        raise ValueError(f"contents {contents!r}: expected {FULL!r} or {HF_EXPORT!r}")
    body = {"format": MANIFEST_FORMAT, "run": os.path.realpath(run), "step": int(step), "contents": contents,
            "files": _file_hashes(folder) if files is None else dict(files)}
    manifest = {**body, "hmac": _signature(key, body)}
    tmp = folder / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, folder / MANIFEST_FILE)
    return folder / MANIFEST_FILE


def resign_subset(folder: str | os.PathLike[str], keep: set[str], contents: str) -> dict[str, Any]:
    """Re-sign `folder` over the files `keep` of its signed manifest (after the others were deleted) as
    `contents`. The kept files' hashes come from the verified old manifest, not from hashing them again: a file
    changed since its save still fails the next verification."""
    old = verify_manifest(folder, hash_files=False)
    files = {name: digest for name, digest in old["files"].items() if name in keep}
    write_manifest(folder, old["run"], int(old["step"]), contents=contents, files=files)
    return {**old, "files": files, "contents": contents}


def verify_manifest(folder: str | os.PathLike[str], hash_files: bool = True) -> dict[str, Any]:
    """The manifest of `folder` when its HMAC is this user's, its run and step are those of `folder`'s place,
    and (with `hash_files`) every file matches it, none missing and none added; :class:`UntrustedCheckpoint`
    naming what is wrong otherwise. The returned manifest always has `contents`."""
    folder = Path(folder)
    path = folder / MANIFEST_FILE
    if not path.is_file():
        raise UntrustedCheckpoint(f"{folder} has no {MANIFEST_FILE}: it was not written by a run of this project "
                                  "under this user (or by a version before checkpoints were signed), or the run "
                                  "stopped before its signing ended")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        names = ("format", "run", "step", "files") + (("contents",) if manifest["format"] != 1 else ())
        body = {k: manifest[k] for k in names}
        claimed = str(manifest["hmac"])
    except (ValueError, KeyError, TypeError):
        raise UntrustedCheckpoint(f"{path} is damaged") from None
    key = signing_key(create=False)
    if key is None or not hmac.compare_digest(_signature(key, body), claimed):
        raise UntrustedCheckpoint(f"{path} is not signed with this user's key ({key_path()}): the checkpoint "
                                  "was written elsewhere, by another user, or its manifest was edited")
    _check_place(folder, str(body["run"]), int(body["step"]))
    if hash_files:
        found = _file_hashes(folder)
        files = body["files"]
        changed = sorted(n for n in files.keys() & found.keys() if files[n] != found[n])
        missing, added = sorted(files.keys() - found.keys()), sorted(found.keys() - files.keys())
        if changed or missing or added:
            raise UntrustedCheckpoint(f"{folder} differs from its signed manifest: changed {changed[:5]}, "
                                      f"missing {missing[:5]}, added {added[:5]}")
    return {**body, "contents": body.get("contents", FULL)}


def _check_place(folder: Path, run: str, step: int) -> None:
    """The signed run and step against where `folder` is: a copy into another step's folder or another run
    would otherwise verify (its files and HMAC are intact) and resume as that step, or into that run."""
    here = Path(os.path.realpath(folder))
    if here.name != f"{VERL_STEP_PREFIX}{step}":
        raise UntrustedCheckpoint(f"{folder} holds the save of step {step} (its signed manifest says so), not "
                                  f"of the step its name says: a checkpoint copied or renamed")
    if os.path.realpath(here.parent.parent) != os.path.realpath(run):
        raise UntrustedCheckpoint(f"{folder} was signed as a save of run {run}, not of {here.parent.parent}: a "
                                  "checkpoint copied from another run, or a run directory moved (then resume it "
                                  f"once with {TRUST_KNOB}=true; its next saves are signed where it is)")


def check_checkpoint(folder: str | os.PathLike[str], trust: bool, hash_files: bool = True) -> str:
    """Whether a resume may load `folder`: a one-line verdict when it may (signed, or trusted by the user);
    :class:`UntrustedCheckpoint` with what to do when it may not."""
    if trust:
        return f"{folder}: loaded without checking its manifest ({TRUST_KNOB}: true)"
    try:
        manifest = verify_manifest(folder, hash_files=hash_files)
    except UntrustedCheckpoint as exc:
        raise UntrustedCheckpoint(f"refusing to resume: {exc}. verl unpickles a checkpoint's files, which runs "
                                  f"any code they hold; if you know where this one comes from, set "
                                  f"{TRUST_KNOB}=true") from None
    return f"{folder}: signed by run {manifest['run']} at step {manifest['step']}"
