"""Recipe comments that state a setting say the setting the recipe has (a reader takes the header at its word)."""

from __future__ import annotations

import re

from seal.recipe import REPO_ROOT, load_config

PHI_ERR_WORDS = {"on": "phi_err on every error observation", "adaptive": "adaptive phi_err", "off": "no phi_err"}


def _header(name: str) -> str:
    lines = (REPO_ROOT / "exp" / name).read_text(encoding="utf-8").splitlines()
    return " ".join(line.lstrip("# ") for line in lines if line.startswith("#"))


def test_each_recipe_header_names_its_phi_err_mode():
    for name in ("SEAL.yaml", "SEAL_release.yaml"):
        header = re.sub(r"\s+", " ", _header(name))
        mode = load_config(REPO_ROOT / "exp" / name).seal.interface.error_feedback
        assert PHI_ERR_WORDS[mode] in header, (name, mode, header)
        for other, words in PHI_ERR_WORDS.items():
            if other != mode:
                assert words not in header, (name, mode, words)


def test_the_release_recipe_describes_its_reset_as_the_code_does():
    """`reset_on_empty` uses the base table for one step and keeps the moving average (seal.core.capability);
    the comment must not describe the older reset of the stored weights."""
    line = next(x for x in (REPO_ROOT / "exp" / "SEAL_release.yaml").read_text().splitlines()
                if "reset_on_empty:" in x)
    text = line + (REPO_ROOT / "exp" / "SEAL_release.yaml").read_text().split(line, 1)[1].split("\n", 2)[1]
    assert "resets the weights" not in text and "not stored" in text, text
    assert load_config(REPO_ROOT / "exp" / "SEAL_release.yaml").seal.capability.reset_on_empty is True
