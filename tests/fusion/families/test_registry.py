"""The catalogue and the emitter registry are the families' unions, and agree with each other."""

from fusecli.fusion import families
from fusecli.fusion.patterns import BY_NAME, CATALOGUE
from fusecli.rewrite.emit import EMITTERS


def test_every_emitter_is_a_pattern_of_its_own_family():
    for family in families.FAMILIES:
        own = {p.name for p in family.PATTERNS}
        assert set(family.EMITTERS) <= own, family.__name__


def test_the_catalogue_and_the_registry_are_the_unions():
    assert [p.name for p in CATALOGUE] == [p.name for f in families.FAMILIES for p in f.PATTERNS]
    assert len(BY_NAME) == len(CATALOGUE)  # one family owns each name
    assert EMITTERS is families.EMITTERS and set(EMITTERS) <= set(BY_NAME)
