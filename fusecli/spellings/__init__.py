"""The exporters' spellings of each op family, as op trees, tagged by who writes them.

One module per family (gelu, norms, acts, softmax, rotary); ``common`` holds the shared checks, the one
``ADD`` and ``Spelling``/``select``. The fusion catalogue takes every spelling of a family, the autodiff
profiles' composites (grad/composites.py) the ones a framework's own exporter writes: both select by tag,
never by position. The matcher looks through no-op casts, Identity and commuted operands itself, so those
make no new spelling.
"""
