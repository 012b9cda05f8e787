"""The checkpoint policy: which saves stay resumable, signing off the critical path, and a run directory whose
every reference points at files that exist and verify (docs/run_directory.md, "Checkpoint policy").

* Keep `trainer.keep_full_checkpoints` (K) full saves, the newest K, plus the best one (`best.json`). From every
  other save drop what only a resume needs (verl: the FSDP shards, the optimizer, the extra state, `data.pt`;
  local: `trainer_state.pt`) and keep the Hugging Face export and `seal_state.json`, so every step stays
  evaluable. A 7B full save is ~107-122 GB; its HF export 15-30 GB.
* verl saves are signed (`seal.engines.checkpoint_trust`) by :class:`SaveSigner` in a background thread, which
  the trainer joins before the next save, before `best.json` names a save, and at the end of the run. Only a
  signed save is published: the `step_N` link and `latest.json` are written after its manifest, and pruning
  (which needs a newer signed full save to exist) runs after that. A pruned save is re-signed as `hf_export`.
* Resume (:func:`verl_resume_folder`): `auto` takes the newest signed full save (a run that stopped while
  hashing leaves its newest save unsigned: skipped, said so); a named save that is pruned or unsigned is refused,
  naming the nearest usable one. The chosen folder's hashes are checked before verl unpickles anything.
* :func:`check_run_references` lists every reference of a run directory that does not hold.

Only the standard library, `seal.run_dir` and `seal.engines.checkpoint_trust`: no verl, no torch, so the
launcher, the local engine and tests use it as is.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from seal.engines.checkpoint_trust import (
    FULL,
    HF_EXPORT,
    MANIFEST_FILE,
    TRUST_KNOB,
    UntrustedCheckpoint,
    check_checkpoint,
    resign_subset,
    verify_manifest,
    write_manifest,
)
from seal.run_dir import SEAL_STATE_FILE, TRAINER_STATE_FILE, VERL_STEP_PREFIX, Checkpoints, RunDir, hf_weights_dir

log = logging.getLogger(__name__)

KEEP_KNOB = "trainer.keep_full_checkpoints"
CHECK_ENV = "SEAL_CHECK_RUN_REFERENCES"  # "1": the verl trainer checks every reference after each save and resume
VERL_HF_EXPORT = "actor/huggingface/"  # where verl 0.9.1's FSDP checkpoint manager writes the HF export
VERL_TRACKER = "latest_checkpointed_iteration.txt"  # verl's own pointer to its newest save
# A bound on waiting for the signer: the folder hashed at no less than this (the slowest disk measured, 170 MB/s,
# is 17x faster), plus a margin for the re-signing and pruning.
SIGN_MIN_BYTES_PER_S = 10e6
SIGN_MARGIN_S = 600.0


def to_prune(full_steps: Iterable[int], keep: int, best: int | None) -> list[int]:
    """The full saves to prune: all but the newest `keep` and `best`."""
    if keep < 1:
        raise ValueError(f"{KEEP_KNOB} = {keep}: at least 1 save must stay resumable")
    steps = sorted(set(full_steps))
    protected = set(steps[-keep:]) | ({best} if best is not None else set())
    return [s for s in steps if s not in protected]


def disk_plan(saves: int, keep: int, full_bytes: float, hf_bytes: float) -> dict[str, float]:
    """Bytes of a run's saves under the policy, planning for a best that is not among the newest `keep`: `peak`,
    during the last save (the newest `keep` before it, the best and the new save full; the policy prunes once the
    new one is signed), and `end`. `full_bytes`: one full save; `hf_bytes`: its HF export (what a pruned save
    keeps)."""
    to_prune([], keep, None)
    full_peak, full_end = min(saves, keep + 2), min(saves, keep + 1)
    return {"peak": full_peak * full_bytes + (saves - full_peak) * hf_bytes,
            "end": full_end * full_bytes + (saves - full_end) * hf_bytes,
            "full_saves_peak": float(full_peak), "full_saves_end": float(full_end)}


def best_step(checkpoints: Checkpoints) -> int | None:
    """The step `best.json` names (None without one, or when it names the base model at step 0)."""
    best = checkpoints.read_best()
    return int(best["step"]) if best and int(best["step"]) > 0 else None


# --------------------------------------------------------------------------- verl saves
def verl_saves(checkpoints: Checkpoints) -> dict[int, Path]:
    """`step -> global_step_N` folder for every verl save present (folders, not the `step_N` links)."""
    out: dict[int, Path] = {}
    for path in checkpoints.root.glob(f"{VERL_STEP_PREFIX}*"):
        number = path.name[len(VERL_STEP_PREFIX):]
        if number.isdigit() and path.is_dir() and not path.is_symlink():
            out[int(number)] = path
    return out


def verl_save_state(folder: Path, trust: bool = False) -> str:
    """`full` or `hf_export` from the folder's signed manifest (HMAC and place checked, files not hashed); else
    why it cannot be used (`unsigned: ...`, `does not verify: ...`). With `trust`, the manifest is read unchecked
    (a folder without one counts as full): the user vouches for the files, but a pruned save still cannot resume."""
    if trust:
        try:
            return str(json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8")).get("contents", FULL))
        except (OSError, ValueError, AttributeError):
            return FULL
    try:
        return str(verify_manifest(folder, hash_files=False)["contents"])
    except UntrustedCheckpoint as exc:
        return f"{'does not verify' if (folder / MANIFEST_FILE).is_file() else 'unsigned'}: {exc}"


def prune_verl(checkpoints: Checkpoints, keep: int) -> list[int]:
    """Apply the policy to the signed verl saves; returns the steps pruned now. Each pruned save is re-signed as
    `hf_export` over what it keeps *before* the rest is deleted, so a prune cut short leaves a manifest naming
    fewer files than are there (finished by the next call), never one naming deleted files. Unsigned saves are
    neither counted nor touched: their files were never verified."""
    states = {step: verl_save_state(folder) for step, folder in verl_saves(checkpoints).items()}
    pruned = []
    for step in to_prune([s for s, state in states.items() if state == FULL], keep, best_step(checkpoints)):
        folder = checkpoints.verl_step_dir(step)
        if hf_weights_dir(folder) is None:
            log.warning("checkpoint policy: %s has no Hugging Face export (actor/huggingface); kept whole so its "
                        "weights survive", folder)
            continue
        names = verify_manifest(folder, hash_files=False)["files"]
        resign_subset(folder, {n for n in names if n.startswith(VERL_HF_EXPORT) or n == SEAL_STATE_FILE}, HF_EXPORT)
        states[step] = HF_EXPORT
        pruned.append(step)
    for step, state in states.items():
        if state == HF_EXPORT:  # also finishes a prune that was cut short
            _delete_unsigned_files(checkpoints.verl_step_dir(step))
    if pruned:
        log.info("checkpoint policy (%s=%d): steps %s keep only their Hugging Face export", KEEP_KNOB, keep, pruned)
    return pruned


def _delete_unsigned_files(folder: Path) -> None:
    """Delete every file of `folder` its manifest does not name, then the folders left empty."""
    kept = set(verify_manifest(folder, hash_files=False)["files"]) | {MANIFEST_FILE}
    for path in sorted(folder.rglob("*"), reverse=True):  # children before their folders
        name = path.relative_to(folder).as_posix()
        if path.is_file() and not path.is_symlink() and name not in kept:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


class SaveSigner:
    """Signs each verl save in a background thread, then publishes it (`step_N` link, `latest.json`) and prunes.

    `saved(step)` after verl (and `seal_state.json`) wrote the step; `join()` before anything that needs the
    save signed (the next save, `best.json`); `settle()` when the best moved and at the end of the run. An error
    in the thread is raised by the next `join()`: a save that could not be signed stops the run. With `check`
    (`SEAL_CHECK_RUN_REFERENCES=1`) every save is joined at once and :func:`check_run_references` must find
    nothing."""

    def __init__(self, checkpoints: Checkpoints, keep: int, check: bool | None = None):
        to_prune([], keep, None)  # the knob's range, at once
        self.checkpoints, self.keep = checkpoints, int(keep)
        self.check = os.environ.get(CHECK_ENV) == "1" if check is None else check
        self._thread: threading.Thread | None = None
        self._step = 0
        self._error: BaseException | None = None
        self.last_sign_s: float | None = None  # how long the last signing took (off the critical path)

    def saved(self, step: int) -> None:
        self.join()
        self._step, self._error = int(step), None
        self._thread = threading.Thread(target=self._sign, args=(int(step),), name=f"seal-sign-{step}", daemon=True)
        self._thread.start()
        if self.check:
            self.join()
            self.check_references(f"after the save of step {step}")

    def check_references(self, when: str) -> None:
        """With `check`: :func:`check_run_references` on the run, raised as one error naming every problem."""
        if self.check:
            raise_problems(self.checkpoints.root.parent, self.keep, when)

    def _sign(self, step: int) -> None:
        try:
            start = time.perf_counter()
            write_manifest(self.checkpoints.verl_step_dir(step), self.checkpoints.root.parent, step)
            self.last_sign_s = time.perf_counter() - start
            self.checkpoints.link_verl_step(step)
            self.checkpoints.write_latest(step)
            prune_verl(self.checkpoints, self.keep)
            log.info("step %d: save signed in %.1f s (in the background), published and pruned", step,
                     self.last_sign_s)
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer's thread by join()
            self._error = exc

    def join(self, quiet: bool = False) -> None:
        """Wait for the signing under way; `quiet`: log its failure instead of raising (the run already failed)."""
        if quiet:
            try:
                self.join()
            except Exception as exc:  # noqa: BLE001 - the run's own error is the one raised
                log.error("signing the last save failed too: %r", exc)
            return
        thread = self._thread
        if thread is None:
            return
        folder = self.checkpoints.verl_step_dir(self._step)
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
        bound = size / SIGN_MIN_BYTES_PER_S + SIGN_MARGIN_S
        thread.join(bound)
        if thread.is_alive():
            raise TimeoutError(f"signing {folder} ({size / 1e9:.1f} GB) has not ended after {bound:.0f} s "
                               f"(at least {SIGN_MIN_BYTES_PER_S / 1e6:.0f} MB/s expected): is its disk stalled?")
        self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"signing or publishing the save of step {self._step} ({folder}) failed: "
                               f"{error!r}; it stays unsigned and resume skips it") from error

    def settle(self) -> None:
        """The last save signed, then the policy applied again: when the best moved (its old step is pruned now)
        and at the end of the run."""
        self.join()
        prune_verl(self.checkpoints, self.keep)


# --------------------------------------------------------------------------- resume
def _unusable(folder: Path, trust: bool) -> str | None:
    """Why a verl resume cannot load `folder` (None: it can)."""
    if not folder.is_dir():
        return "it does not exist"
    state = verl_save_state(folder, trust)
    if state == HF_EXPORT:
        return f"pruned by the checkpoint policy ({KEEP_KNOB}): only its Hugging Face export is left"
    return None if state == FULL else state


def usable_verl_saves(checkpoints: Checkpoints, trust: bool = False) -> dict[int, Path]:
    return {s: f for s, f in verl_saves(checkpoints).items() if _unusable(f, trust) is None}


def nearest_usable(checkpoints: Checkpoints, step: int, trust: bool = False) -> str:
    """The usable save nearest to `step` (the later one on a tie), as a phrase for an error message."""
    usable = usable_verl_saves(checkpoints, trust)
    if not usable:
        return f"no save in {checkpoints.root} can be resumed"
    near = min(usable, key=lambda s: (abs(s - step), -s))
    return (f"the nearest usable save is {usable[near]} (trainer.resume={usable[near]}; usable steps: "
            f"{sorted(usable)})")


def verl_resume_folder(checkpoints: Checkpoints, resume: str, trust: bool, verify: bool = False) -> Path | None:
    """The `global_step_N` folder a verl run resumes from by `trainer.resume` (`auto`, `disable` or a folder),
    None for a fresh start; :class:`UntrustedCheckpoint` or `FileNotFoundError` naming what to do otherwise.
    The candidates' HMACs and places are checked; with `verify` also every file of the one chosen (unless
    `trust`), which must happen before verl unpickles anything in it."""
    folder = _resume_candidate(checkpoints, resume, trust)
    if verify and folder is not None:
        log.info("%s", check_checkpoint(folder, trust=trust))
    return folder


def _resume_candidate(checkpoints: Checkpoints, resume: str, trust: bool) -> Path | None:
    if resume == "disable":
        return None
    if resume == "auto":
        saves = verl_saves(checkpoints)
        skipped = []
        for step in sorted(saves, reverse=True):
            why = _unusable(saves[step], trust)
            if why is None:
                if skipped:
                    log.warning("resume: skipping newer saves: %s", "; ".join(skipped))
                return saves[step]
            skipped.append(f"step {step}: {why}")
        if skipped:
            raise UntrustedCheckpoint(f"refusing to resume: no save in {checkpoints.root} can be resumed "
                                      f"({'; '.join(skipped)}). Set trainer.resume=disable to start afresh "
                                      f"(this replaces the run's metrics), or {TRUST_KNOB}=true for saves you know")
        return None
    folder = Path(os.path.realpath(os.path.expanduser(resume)))
    why = _unusable(folder, trust)
    if why is None:
        return folder
    number = folder.name[len(VERL_STEP_PREFIX):]
    step = int(number) if folder.name.startswith(VERL_STEP_PREFIX) and number.isdigit() else 0
    error = FileNotFoundError if why == "it does not exist" else UntrustedCheckpoint
    trust_hint = (f". verl unpickles a checkpoint's files, which runs any code they hold; if you know where this one "
                  f"comes from, set {TRUST_KNOB}=true" if why.startswith(("unsigned", "does not verify")) else "")
    raise error(f"refusing to resume from trainer.resume={resume}: {why}; "
                f"{nearest_usable(Checkpoints(folder.parent), step, trust)}{trust_hint}")


# --------------------------------------------------------------------------- the references of a run directory
def check_run_references(run_dir: str | os.PathLike[str], keep: int | None = None,
                         hash_files: bool = True) -> list[str]:
    """Every reference of a run directory that does not hold, one line each (empty: all hold): `latest.json`,
    `best.json`, the `step_N` links and verl's tracker name saves that exist and (verl) verify; every signed save
    verifies, its manifest's step and run are its place's; `latest.json` and `best.json` name full saves; a
    pruned save holds its HF export and nothing else. With `keep`, also the policy: the full saves are at most
    the newest `keep` and the best. Call it with no signing under way (after `SaveSigner.join`)."""
    run = RunDir(run_dir)
    ckpts = run.checkpoints
    if not ckpts.root.is_dir():
        return []
    problems: list[str] = []
    verdicts: dict[Path, str] = {}

    def save(label: str, path: Path, step: int, need_full: bool) -> None:
        real = Path(os.path.realpath(path))
        if not real.is_dir():
            problems.append(f"{label} names {path}, which does not exist")
            return
        if real not in verdicts:
            verdicts[real] = _verdict(real, hash_files)
        verdict = verdicts[real]
        if real.name.startswith(VERL_STEP_PREFIX) and real.name != f"{VERL_STEP_PREFIX}{step}":
            problems.append(f"{label} names step {step}, but {path} is {real.name}")
        if not verdict.startswith(("full", "hf_export")):
            problems.append(f"{label} names {path}: {verdict}")
        elif need_full and verdict != FULL:
            problems.append(f"{label} names {path}, which cannot be resumed ({verdict})")

    for name, need_full in (("latest.json", True), ("best.json", True)):
        pointer = ckpts.root / name
        if pointer.is_file():
            try:
                entry = json.loads(pointer.read_text(encoding="utf-8"))
                step, rel = int(entry["step"]), str(entry["path"])
            except (ValueError, KeyError, TypeError) as exc:
                problems.append(f"{pointer}: cannot be read ({exc!r})")
                continue
            if not (name == "best.json" and step == 0):  # a best at step 0 names the base model
                save(name, run.root / rel, step, need_full)
    for step, path in sorted(ckpts.saved_steps().items()):
        save(f"{path.name}", path, step, need_full=False)
    for link in ckpts.root.glob("step_*"):
        if link.is_symlink() and not link.exists():
            problems.append(f"{link.name} is a link to {os.readlink(link)}, which does not exist")
    for step, folder in sorted(verl_saves(ckpts).items()):
        if (folder / MANIFEST_FILE).is_file():
            save(folder.name, folder, step, need_full=False)
    tracker = ckpts.root / VERL_TRACKER
    named = tracker.read_text(encoding="utf-8").strip() if tracker.is_file() else None
    if named is not None and not (named.isdigit() and ckpts.verl_step_dir(int(named)).is_dir()):
        problems.append(f"{VERL_TRACKER} names step {named!r}, whose folder does not exist")
    if keep is not None:
        problems += _policy_problems(ckpts, keep, verdicts)
    return problems


def _verdict(folder: Path, hash_files: bool) -> str:
    """`full` / `hf_export` for a save that verifies (verl) or is complete (local); else what is wrong."""
    if folder.name.startswith(VERL_STEP_PREFIX):
        try:
            contents = verify_manifest(folder, hash_files=hash_files)["contents"]
        except UntrustedCheckpoint as exc:
            return f"does not verify: {exc}"
        if contents == HF_EXPORT and hf_weights_dir(folder) is None:
            return "pruned, and its Hugging Face export is missing"
        return str(contents)
    if hf_weights_dir(folder) is None:
        return "has no Hugging Face weights"
    return FULL if (folder / TRAINER_STATE_FILE).is_file() else HF_EXPORT


def _policy_problems(ckpts: Checkpoints, keep: int, verdicts: dict[Path, str]) -> list[str]:
    saves = verl_saves(ckpts) or {s: p for s, p in ckpts.saved_steps().items() if not p.is_symlink()}
    full = [s for s, p in saves.items()
            if (verdicts.get(Path(os.path.realpath(p))) or _verdict(Path(os.path.realpath(p)), False)) == FULL]
    extra = to_prune(full, keep, best_step(ckpts))
    return [f"the checkpoint policy ({KEEP_KNOB}={keep}) keeps the newest {keep} full saves and the best, but "
            f"steps {extra} are full too"] if extra else []


def raise_problems(run_dir: str | os.PathLike[str], keep: int | None, when: str) -> None:
    """:func:`check_run_references`, raised as one error naming every problem (`SEAL_CHECK_RUN_REFERENCES=1`)."""
    problems = check_run_references(run_dir, keep)
    if problems:
        raise RuntimeError(f"run directory {run_dir} {when}: " + "; ".join(problems))
    log.info("run directory %s %s: every reference holds", run_dir, when)


# --------------------------------------------------------------------------- the local engine
def prune_local(checkpoints: Checkpoints, keep: int) -> list[int]:
    """The policy on the local engine's `step_N` folders: `trainer_state.pt` (the optimizer) leaves all but the
    newest `keep` and the best; the HF model, tokenizer and `seal_state.json` stay."""
    saves = {s: p for s, p in checkpoints.saved_steps().items() if not p.is_symlink()}
    pruned = []
    for step in to_prune([s for s, p in saves.items() if (p / TRAINER_STATE_FILE).is_file()], keep,
                         best_step(checkpoints)):
        if hf_weights_dir(saves[step]) is None:
            log.warning("checkpoint policy: %s has no Hugging Face weights; kept whole", saves[step])
            continue
        (saves[step] / TRAINER_STATE_FILE).unlink()
        pruned.append(step)
    return pruned


def check_local_resume(folder: Path) -> None:
    """A local checkpoint named by `trainer.resume` must hold `trainer_state.pt`; else the nearest that does."""
    if (folder / TRAINER_STATE_FILE).is_file():
        return
    ckpts = Checkpoints(folder.parent)
    usable = {s: p for s, p in ckpts.saved_steps().items() if (p / TRAINER_STATE_FILE).is_file()}
    number = folder.name.rpartition("_")[2]
    step = int(number) if number.isdigit() else 0
    hint = (f"the nearest usable one is {usable[min(usable, key=lambda s: (abs(s - step), -s))]} (usable steps: "
            f"{sorted(usable)})" if usable else f"no checkpoint in {ckpts.root} can be resumed")
    raise FileNotFoundError(f"trainer.resume={folder}: no {TRAINER_STATE_FILE} (pruned by the checkpoint policy, "
                            f"{KEEP_KNOB}, or not a checkpoint of this engine); {hint}")
