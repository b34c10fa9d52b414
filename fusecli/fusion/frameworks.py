"""Would TensorFlow's Grappler remapper, ONNX Runtime or PyTorch fuse this match, on CPU and on GPU, and
why not: the lookup over the families' NOTES (fusion/families/), each framework's default where a family
says nothing (notes_kit).

Facts from Grappler's remapper (seed post "Fused Operations in Tensorflow": Conv2D+BiasAdd+act on
GPU through cuDNN's cudnnConvolutionBiasActivationForward, Relu only, float32, not for 1x1 filters;
Conv2D+FusedBatchNorm(+act) on CPU in inference only; Conv2D+Squeeze+BiasAdd on CPU only) and
from ONNX Runtime's graph transformers (ConvActivationFusion: FusedConv with Relu/Sigmoid/Tanh/
LeakyRelu/Clip/HardSigmoid on CPU, Relu only in the CUDA FusedConv kernel; FusedGemm CPU only;
MatMulScaleFusion, GeluFusion, BiasGeluFusion, LayerNormFusion, SkipLayerNormFusion).
"""

from __future__ import annotations

from .families import NOTES
from .match import Match
from .notes_kit import FRAMEWORKS, default, note, verdict


def framework_notes(m: Match) -> dict:
    """Per framework, its verdict on ``m``: the family's entry read for it (``notes_kit.note``)."""
    notes = {}
    for fw, fixed, entry in _entries(m):
        if fixed is None:
            got = entry(m)
            notes[fw] = got if got is not None else default(fw, m)
        else:
            notes[fw] = dict(fixed)  # a copy: each match owns its notes
    return notes


_ENTRIES: dict[int, tuple] = {}  # id(pattern) -> (pattern, per framework (name, fixed verdict, entry))


def _entries(m: Match) -> tuple:
    """Per framework: (name, the verdict when it does not depend on the match, else None, the family's
    function of the match), made once per pattern: ``note`` reads a tuple entry or an absent one (the
    default, which reads the pattern's phase only) the same way for every match."""
    got = _ENTRIES.get(id(m.pattern))
    if got is None or got[0] is not m.pattern:
        own = NOTES.get(m.pattern.name, {})
        entries = tuple((fw, None, own[fw]) if callable(own.get(fw)) else (fw, note(own.get(fw), fw, m), None)
                        for fw in FRAMEWORKS)
        got = _ENTRIES[id(m.pattern)] = (m.pattern, entries)
    return got[1]


def not_fusable_notes(notes: dict) -> dict:
    """A match that is not fusable here is fused by no framework, whatever the pattern allows elsewhere."""
    return {k: verdict(False, False, "not fusable here: an interior tensor must be written out; "
                       f"elsewhere: {v['note']}") for k, v in notes.items()}
