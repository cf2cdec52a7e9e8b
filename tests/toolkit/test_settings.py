"""Every ``CREST_*`` variable is parsed in one place (``toolkit.settings``): one table, one default each; an unset or
empty variable keeps its default; a bad value raises naming the variable, its value and the rule; no product module
reads a ``CREST_*`` variable itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support import REPO
from toolkit.settings import DEFAULTS, Settings, table

PRODUCT = ("toolkit", "datastore", "ingest", "live", "drafting", "decoder", "evaluation", "serving", "crest_native")


def test_an_empty_environment_gives_every_default():
    got = Settings.from_env({"XDG_CACHE_HOME": "/x"})
    for variable, _, doc in table():
        assert (variable == "DATABASE_URL" or variable.startswith("CREST_")) and doc, variable
    assert got.min_score == DEFAULTS.min_score == 0.1 and got.live and got.compact_outputs == 64
    assert got.cache == Path("/x/crest-spec") and got.replicas_dir == Path("/x/crest-spec/replicas")
    assert Settings.from_env({"CREST_MIN_SCORE": ""}).min_score == 0.1  # empty: unset


def test_each_variable_is_parsed_by_its_rule():
    got = Settings.from_env({"CREST_MIN_SCORE": "0.25", "CREST_LIVE": "0", "CREST_COMPACT_OUTPUTS": "8",
                             "CREST_OUTPUTS_MB": "16", "CREST_REPLICAS": "off", "CREST_DATASTORE": "code"})
    assert (got.min_score, got.live, got.compact_outputs, got.outputs_mb) == (0.25, False, 8, 16.0)
    assert got.replicas_dir is None and got.datastore == "code"


@pytest.mark.parametrize("variable, value, rule", [
    ("CREST_MIN_SCORE", "1.5", "must be in [0, 1]"),
    ("CREST_MIN_SCORE", "high", "is not a number"),
    ("CREST_LIVE", "yes", "must be 0 or 1"),
    ("CREST_COMPACT_OUTPUTS", "0", ">= 1"),
    ("CREST_LOG_BACKUPS", "many", ""),
])
def test_a_bad_value_names_the_variable_its_value_and_the_rule(variable, value, rule):
    with pytest.raises(ValueError, match=re.escape(f"{variable}={value!r}")) as raised:
        Settings.from_env({variable: value})
    assert rule in str(raised.value)


def test_no_product_module_reads_a_crest_variable_itself():
    """``os.environ["CREST_..."]``, ``environ.get("CREST_...")`` or ``getenv("CREST_...")`` appear only in
    ``toolkit/settings.py``; every variable the product's sources name is in the table."""
    known = {variable for variable, _, _ in table()}
    read = re.compile(r"(environ\.get\(|environ\[|getenv\()\s*[\"'](CREST_\w+)")
    named = re.compile(r"\bCREST_[A-Z_]+\b")
    for package in PRODUCT:
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text()
            if path != REPO / "toolkit" / "settings.py":
                assert not read.search(text), path
            unknown = {v for v in named.findall(text) if v not in known and not v.endswith("_")}
            assert not unknown, (path, unknown)
