"""`docs/release_differences.md` is complete and checked against the recipe schema and `exp/SEAL_release.yaml`.

* Every switch the table names (the "switch: release setting" column) is a key of the recipe schema; a
  ``key: value`` entry's value is the one `exp/SEAL_release.yaml` resolves to.
* Every key whose value in `exp/SEAL_release.yaml` differs from our default (`exp/defaults.yaml`, generated from
  the schema) is named in that column.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from seal.recipe import EXP_DIR, load_config, to_container

PAGE = Path(__file__).resolve().parents[1] / "docs" / "release_differences.md"
SWITCH_COLUMN = 3  # | # | release | here | switch: release setting | where |


def flat(node: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            out |= flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def spelled(value: object) -> str:
    """A value as the page writes it (YAML spelling for booleans and null)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def switch_entries() -> list[tuple[int, str, str | None]]:
    """(row, key, release value or None) for every backticked entry of the switch column."""
    out = []
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].isdigit():
            continue
        for entry in re.findall(r"`([^`]+)`", cells[SWITCH_COLUMN]):
            if entry.startswith("--"):
                continue  # a service flag, given beside its recipe key
            key, _, value = entry.partition(": ")
            out.append((int(cells[0]), key.strip(), value.strip() if value else None))
    return out


RELEASE = flat(to_container(load_config(str(EXP_DIR / "SEAL_release.yaml"))))
DEFAULTS = flat(to_container(load_config(str(EXP_DIR / "defaults.yaml"))))
ENTRIES = switch_entries()


def test_page_has_rows_and_switches():
    rows = {row for row, _, _ in ENTRIES}
    assert len(ENTRIES) >= 20 and len(rows) >= 15


@pytest.mark.parametrize("row, key, value", ENTRIES, ids=[f"{r}:{k}" for r, k, _ in ENTRIES])
def test_listed_switch_is_a_recipe_key_with_the_release_setting(row, key, value):
    assert key in DEFAULTS, f"row {row}: {key!r} is not a key of the recipe schema"
    if value is not None:
        assert spelled(RELEASE[key]) == value, f"row {row}: exp/SEAL_release.yaml has {key}: {RELEASE[key]!r}"


def test_every_release_setting_that_differs_from_ours_is_listed():
    listed = {key for _, key, _ in ENTRIES}
    differing = {k for k in RELEASE if RELEASE[k] != DEFAULTS.get(k)} - {"experiment_name"}
    assert differing, "exp/SEAL_release.yaml should differ from the defaults"
    assert sorted(differing - listed) == []
