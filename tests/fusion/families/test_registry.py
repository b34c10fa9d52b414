"""The catalogue and the registries are the families' unions, agree with each other, and every catalogue
pattern has a family test that builds a graph and matches it."""

import importlib

from fusecli.fusion import families
from fusecli.fusion.notes_kit import FRAMEWORKS
from fusecli.fusion.patterns import BY_NAME, CATALOGUE
from fusecli.fusion.recompute import RULES
from fusecli.rewrite.kernels.registry import BY_KEY, EMITTERS


def _short(family) -> str:
    return family.__name__.rsplit(".", 1)[1]


def test_every_emitter_label_and_note_is_a_pattern_of_its_own_family():
    for family in families.FAMILIES:
        own = {p.name for p in family.PATTERNS}
        for registry in (family.KERNELS, getattr(family, "LABELS", {}), family.NOTES):
            assert set(registry) <= own, family.__name__
        assert all(set(notes) <= set(FRAMEWORKS) for notes in family.NOTES.values()), family.__name__


def test_every_recompute_rule_is_known():
    assert {p.recompute for p in CATALOGUE if p.recompute} <= set(RULES)


def test_the_catalogue_and_the_registry_are_the_unions():
    assert [p.name for p in CATALOGUE] == [p.name for f in families.FAMILIES for p in f.PATTERNS]
    assert len(BY_NAME) == len(CATALOGUE)  # one family owns each name
    assert set(EMITTERS) == set(families.KERNELS) <= set(BY_NAME)
    assert {EMITTERS[name] for name in EMITTERS} <= set(BY_KEY.values())


def test_every_kernel_key_has_one_emitter_registered_by_rewrite():
    """Families name their kernels by a key; rewrite's registry maps every key to an emitter, and holds no
    key no family names."""
    assert set(families.KERNELS.values()) == set(BY_KEY)
    assert all(EMITTERS[name] is BY_KEY[key] for name, key in families.KERNELS.items())
    assert set(families.LABELS) <= set(BY_NAME) and set(families.NOTES) <= set(BY_NAME)


def test_every_pattern_has_a_family_test_that_builds_and_matches_it():
    """Each tests/fusion/families/test_<family>.py declares GRAPHS (checked there by matching each);
    they cover their own family's patterns, and together the whole catalogue."""
    covered: set[str] = set()
    for family in families.FAMILIES:
        test = importlib.import_module(f"tests.fusion.families.test_{_short(family)}")
        assert set(test.GRAPHS) <= {p.name for p in family.PATTERNS}, _short(family)
        covered |= set(test.GRAPHS)
    assert sorted(set(BY_NAME) - covered) == []
