"""Mutated saved_model.pb files never crash or hang the SavedModel loader."""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fusecli.core.errors import FuseError
from fusecli.pipeline import Options, analyze
from tests.test_fuzz import time_limit

tf = pytest.importorskip("tensorflow")
from tests.load.test_savedmodel import saved_models  # noqa: E402

SOURCES = ("conv_bn_relu", "keras3_cnn")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(SOURCES), edits=st.lists(
    st.tuples(st.sampled_from(["flip", "cut", "zero"]), st.floats(0, 1), st.integers(1, 255)),
    min_size=1, max_size=3))
@example(name="keras3_cnn", edits=[("flip", 0.6929828762322424, 10)])  # found: a tensor ref 'node:out:'
def test_mutated_saved_model_pb_fails_cleanly(name, edits, tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("sm"))
    source = saved_models()[name]
    data = bytearray(open(os.path.join(source, "saved_model.pb"), "rb").read())
    for kind, where, value in edits:
        i = min(int(where * len(data)), len(data) - 1)
        if kind == "flip":
            data[i] ^= value
        elif kind == "cut":
            del data[i:]
        else:
            data[i] = 0
        if not data:
            break
    with open(os.path.join(folder, "saved_model.pb"), "wb") as f:
        f.write(bytes(data))
    shutil.copytree(os.path.join(source, "variables"), os.path.join(folder, "variables"))
    with time_limit(20):
        try:
            analyze(folder, Options(batch=2))
        except FuseError as e:
            assert str(e) and "\n" not in str(e).strip()
