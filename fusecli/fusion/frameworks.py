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
from .notes_kit import FRAMEWORKS, note, verdict


def framework_notes(m: Match) -> dict:
    own = NOTES.get(m.pattern.name, {})
    return {fw: note(own.get(fw), fw, m) for fw in FRAMEWORKS}


def not_fusable_notes(notes: dict) -> dict:
    """A match that is not fusable here is fused by no framework, whatever the pattern allows elsewhere."""
    return {k: verdict(False, False, "not fusable here: an interior tensor must be written out; "
                       f"elsewhere: {v['note']}") for k, v in notes.items()}
